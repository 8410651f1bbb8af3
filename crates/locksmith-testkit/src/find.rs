//! Finding server binaries.

use std::env;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Finds the executable `name` on `PATH`, panicking with an install hint if it is
/// missing.
///
/// `debian_package` is the package that installs it; the panic message reads
/// ``redis-server not found on PATH: install it with `apt-get install
/// redis-server`, or run scripts/test which does``. Tests never skip because a
/// server is missing.
///
/// ```no_run
/// let redis = locksmith_testkit::binary("redis-server", "redis-server");
/// assert!(redis.is_absolute());
/// ```
#[track_caller]
pub fn binary(name: &str, debian_package: &str) -> PathBuf {
    crate::or_panic(try_binary(name, debian_package))
}

/// Like [`binary`], returning [`Error::NotInstalled`] instead of panicking.
pub fn try_binary(name: &str, debian_package: &str) -> Result<PathBuf> {
    find_on_path(name).ok_or_else(|| not_installed(name, debian_package))
}

/// The [`Error::NotInstalled`] for `name` from `package`.
pub(crate) fn not_installed(name: &str, package: &str) -> Error {
    Error::NotInstalled {
        name: name.to_owned(),
        looked_in: "on PATH".to_owned(),
        package: package.to_owned(),
    }
}

/// The first executable file called `name` in the directories of `PATH`.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let path = PathBuf::from(name);
        return is_executable(&path).then_some(path);
    }
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
