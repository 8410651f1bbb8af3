//! [`Secret`]: a password from a URL, which no `Debug` output shows.

use std::fmt;

/// A password: `Debug` prints `***`, and the text is read only where it is
/// sent to the server ([`Secret::expose`]).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    pub fn new(text: String) -> Secret {
        Secret(text)
    }

    /// The password itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn debug_hides_the_password() {
        let secret = Secret::new("hunter2".into());
        assert_eq!(format!("{secret:?}"), "***");
        assert_eq!(
            format!("{:?}", Some(("u", secret.clone()))),
            r#"Some(("u", ***))"#
        );
        assert_eq!(secret.expose(), "hunter2");
    }
}
