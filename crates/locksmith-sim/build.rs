//! The simulation's entropy (module `entropy`) replaces libc's `getrandom`
//! in the binaries of this crate. std and tokio call it directly; the
//! `getrandom` crate (rand 0.9's thread RNG, which openraft draws its
//! election timeouts from) looks it up with `dlsym`, which finds an
//! executable's function only if its dynamic symbol table lists it.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=getrandom");
    println!("cargo:rustc-link-arg-tests=-Wl,--export-dynamic-symbol=getrandom");
}
