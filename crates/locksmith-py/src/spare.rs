//! The boxes the asyncio API's futures live in, their memory kept for the
//! next call on the same thread.
//!
//! A call's future is boxed when its awaitable is made (it must stay where
//! it is once polled) and freed when the call ends. The client's acquire
//! future is large (kilobytes: the model's, the backend's and a timer's
//! state, one beside the other), beyond what glibc's per-thread caches
//! serve: each box went through its shared bins, about once per acquire.
//! A [`SpareBox`] takes its memory from a few blocks each thread keeps
//! from the boxes it freed before, and gives it back there, so that an
//! event loop's steady stream of calls allocates nothing for their futures.
//! Small boxes go to the allocator as `Box` would, which serves them from
//! its own per-thread cache. A box dropped on another thread than the one
//! that made it leaves its block to that thread; a thread's blocks are
//! freed when it ends (and a box dropped while its thread's locals are
//! being destroyed frees its own).

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;

/// Boxes smaller than this go straight to the allocator: glibc serves
/// them from its per-thread cache (`tcache`, up to 1 032 bytes).
const SMALLEST_KEPT: usize = 1024;

/// Blocks a thread keeps: a few kinds of call, each a few at a time.
const KEPT: usize = 8;

/// The blocks one thread keeps, with their layouts.
struct Spares(Vec<(Layout, NonNull<u8>)>);

impl Drop for Spares {
    fn drop(&mut self) {
        for (layout, block) in self.0.drain(..) {
            // SAFETY: every block kept was allocated with its layout.
            unsafe { alloc::dealloc(block.as_ptr(), layout) };
        }
    }
}

thread_local! {
    static SPARES: RefCell<Spares> = const { RefCell::new(Spares(Vec::new())) };
}

/// A block for `layout` (not zero-sized): a kept one, else a new one.
fn allocate(layout: Layout) -> NonNull<u8> {
    if layout.size() >= SMALLEST_KEPT {
        let kept = SPARES.try_with(|spares| {
            let mut spares = spares.borrow_mut();
            let index = spares.0.iter().rposition(|(kept, _)| *kept == layout)?;
            Some(spares.0.swap_remove(index).1)
        });
        if let Ok(Some(block)) = kept {
            return block;
        }
    }
    // SAFETY: `layout` is not zero-sized (the caller's promise).
    let block = unsafe { alloc::alloc(layout) };
    NonNull::new(block).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

/// Takes back a block of `layout` from [`allocate`]: kept if there is
/// room, else freed.
///
/// # Safety
///
/// `block` was allocated by [`allocate`] with `layout`, and nothing uses
/// it any more.
unsafe fn free(layout: Layout, block: NonNull<u8>) {
    if layout.size() >= SMALLEST_KEPT {
        let kept = SPARES.try_with(|spares| {
            let mut spares = spares.borrow_mut();
            if spares.0.len() < KEPT {
                spares.0.push((layout, block));
                true
            } else {
                false
            }
        });
        if kept == Ok(true) {
            return;
        }
    }
    // SAFETY: as the caller promises.
    unsafe { alloc::dealloc(block.as_ptr(), layout) };
}

/// An owned `T` (a `dyn Step`) pinned in a block of [`allocate`], as a
/// `Pin<Box<T>>` is in one of the allocator's.
pub struct SpareBox<T: ?Sized> {
    value: NonNull<T>,
    /// Owns a `T` (for the drop check), as `Box<T>` does.
    owns: PhantomData<T>,
}

// SAFETY: a `SpareBox` owns its value as a `Box` does, and moves between
// threads as the value would; its block is plain memory, free to give back
// on any thread.
unsafe impl<T: ?Sized + Send> Send for SpareBox<T> {}

impl<T: ?Sized> SpareBox<T> {
    /// Boxes the value `make` makes, once its block is there (so that the
    /// value can be written into it as it is made: one made before would be
    /// kept on the stack until then, and copied), and `unsize` makes the
    /// box's pointer the one it is kept as (`|value| value` for a `dyn
    /// Trait`; stable Rust lets no other smart pointer than std's unsize
    /// itself).
    ///
    /// # Safety
    ///
    /// `unsize` returns its argument, unsized: the same address, and the
    /// metadata of a `V` (a `dyn Trait`'s vtable for `V`). The drop and
    /// the block's layout are taken from that metadata.
    #[inline(always)]
    pub unsafe fn pin<V>(
        make: impl FnOnce() -> V,
        unsize: impl FnOnce(NonNull<V>) -> NonNull<T>,
    ) -> Pin<Self> {
        let layout = Layout::new::<V>();
        let typed = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            allocate(layout).cast::<V>()
        };
        // SAFETY: `typed` is aligned and large enough for a `V` (or a
        // dangling pointer for a zero-sized one, which is valid for it).
        unsafe { typed.as_ptr().write(make()) };
        let value = unsize(typed);
        debug_assert_eq!(value.cast::<u8>(), typed.cast::<u8>());
        // SAFETY: the value is never moved out of its block until dropped
        // in place (`Drop`).
        unsafe {
            Pin::new_unchecked(SpareBox {
                value,
                owns: PhantomData,
            })
        }
    }
}

impl<T: ?Sized> std::ops::Deref for SpareBox<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the value lives until the box is dropped.
        unsafe { self.value.as_ref() }
    }
}

impl<T: ?Sized> std::ops::DerefMut for SpareBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the value lives until the box is dropped, and the box
        // owns it.
        unsafe { self.value.as_mut() }
    }
}

impl<T: ?Sized> Drop for SpareBox<T> {
    fn drop(&mut self) {
        /// Gives the block back when dropped: after the value's drop, even
        /// if that panics.
        struct Block(Layout, NonNull<u8>);

        impl Drop for Block {
            fn drop(&mut self) {
                if self.0.size() != 0 {
                    // SAFETY: the block came from `allocate` with this
                    // layout, and its value has been dropped.
                    unsafe { free(self.0, self.1) };
                }
            }
        }

        // SAFETY: the value is alive; its layout is the one its block was
        // allocated with (`pin`'s promise).
        let layout = unsafe { Layout::for_value(self.value.as_ref()) };
        let block = Block(layout, self.value.cast());
        // SAFETY: the value is alive, and dropped once, here; it is not
        // used after this.
        unsafe { self.value.as_ptr().drop_in_place() };
        drop(block);
    }
}
