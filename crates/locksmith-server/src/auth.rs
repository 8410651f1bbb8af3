//! Who may do what: authentication of callers and authorization by lock-name
//! prefix (`--auth-file`). Every access decision of the server is made here.
//!
//! The auth file (TOML) lists identities. Each proves itself either with a
//! bearer token (gRPC metadata `authorization: Bearer <token>`; the file holds
//! only the token's SHA-256, in hex) or with a client certificate whose
//! subject, as RFC 4514 prints it (`CN=ci`), the file names. Each has grants:
//! permissions on the names under a prefix.
//!
//! ```toml
//! [[identity]]
//! name = "ci"
//! token_sha256 = "…64 hex digits…"
//! grants = [ { prefix = "jobs/", permissions = ["lock", "inspect"] } ]
//!
//! [[identity]]
//! name = "ops"
//! cert_subject = "CN=ops"
//! grants = [ { prefix = "*", permissions = ["admin", "inspect"] } ]
//! ```
//!
//! - **Permissions**: [`Permission::Inspect`] (describe, list, history),
//!   [`Permission::Lock`] (acquire, release, renew) and [`Permission::Admin`]
//!   (force-release). Calls that reach beyond one name need the permission on
//!   every name, i.e. a grant on the prefix `""` (or `"*"`): listing sessions
//!   (inspect), ending a session and changing the cluster's membership
//!   (admin).
//! - **Prefixes** are plain string prefixes; a trailing `*` is allowed and
//!   means the same (`jobs/*` = `jobs/`).
//! - A caller without valid credentials gets `UNAUTHENTICATED` and nothing
//!   else; a denied call gets `PERMISSION_DENIED` and changes nothing;
//!   listings leave out what the caller may not inspect.
//! - Token hashes are compared in constant time, against every identity.
//!   Neither tokens nor hashes ever appear in errors or logs.
//! - The file is read again on [`Auth::reload`] (SIGHUP for `locksmith
//!   serve`); a file that does not load keeps the previous one in force and
//!   says why in the log. A reload applies to every later request, including
//!   those on session streams already open.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;
use tonic::Status;
use x509_cert::der::Decode;

use crate::error::ServerError;

/// What an identity may do to the locks under a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Permission {
    /// See locks, waiters and grant history.
    Inspect,
    /// Acquire, release and renew.
    Lock,
    /// Force-release locks, end sessions, change cluster membership.
    Admin,
}

impl Permission {
    fn as_str(self) -> &'static str {
        match self {
            Permission::Inspect => "inspect",
            Permission::Lock => "lock",
            Permission::Admin => "admin",
        }
    }
}

/// The auth file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    identity: Vec<IdentityEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityEntry {
    name: String,
    token_sha256: Option<String>,
    cert_subject: Option<String>,
    #[serde(default)]
    grants: Vec<GrantEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantEntry {
    prefix: String,
    permissions: Vec<Permission>,
}

/// How an identity proves itself.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Credential {
    TokenSha256([u8; 32]),
    CertSubject(String),
}

#[derive(Debug)]
struct Identity {
    name: String,
    credential: Credential,
    grants: Vec<(String, Permission)>,
}

impl Identity {
    fn may(&self, permission: Permission, name: &str) -> bool {
        self.grants
            .iter()
            .any(|(prefix, granted)| *granted == permission && name.starts_with(prefix.as_str()))
    }
}

/// The identities of one version of the auth file.
#[derive(Debug)]
struct Identities(Vec<Arc<Identity>>);

impl Identities {
    fn parse(text: &str) -> Result<Identities, String> {
        // The error's message and line only: toml's own rendering quotes the
        // line, which may hold a token hash.
        let file: AuthFile = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|span| text[..span.start].lines().count().max(1));
            match line {
                Some(line) => format!("line {line}: {}", e.message()),
                None => e.message().to_owned(),
            }
        })?;
        let mut names = HashSet::new();
        let mut credentials = Vec::new();
        let mut identities = Vec::new();
        for entry in file.identity {
            let name = entry.name;
            if name.is_empty() {
                return Err("an identity has an empty name".into());
            }
            if !names.insert(name.clone()) {
                return Err(format!("identity {name:?} is listed twice"));
            }
            let credential = match (entry.token_sha256, entry.cert_subject) {
                (Some(hex), None) => {
                    Credential::TokenSha256(parse_sha256(&hex).ok_or_else(|| {
                        format!("identity {name:?}: token_sha256 must be 64 hex digits")
                    })?)
                }
                (None, Some(subject)) if !subject.trim().is_empty() => {
                    Credential::CertSubject(subject.trim().to_owned())
                }
                (None, Some(_)) => return Err(format!("identity {name:?}: empty cert_subject")),
                _ => {
                    return Err(format!(
                        "identity {name:?} needs exactly one of token_sha256 and cert_subject"
                    ))
                }
            };
            if credentials.contains(&credential) {
                return Err(format!(
                    "identity {name:?} has the same credential as another identity"
                ));
            }
            credentials.push(credential.clone());
            let grants = entry
                .grants
                .into_iter()
                .flat_map(|grant| {
                    let prefix = grant.prefix.strip_suffix('*').unwrap_or(&grant.prefix);
                    let prefix = prefix.to_owned();
                    grant
                        .permissions
                        .into_iter()
                        .map(move |p| (prefix.clone(), p))
                })
                .collect();
            identities.push(Arc::new(Identity {
                name,
                credential,
                grants,
            }));
        }
        Ok(Identities(identities))
    }

    /// The identity whose token has this SHA-256; every identity is compared,
    /// each in constant time, so timing says nothing about the hashes.
    fn by_token(&self, hash: &[u8; 32]) -> Option<Arc<Identity>> {
        let mut found = None;
        for identity in &self.0 {
            if let Credential::TokenSha256(expected) = &identity.credential {
                if bool::from(expected.ct_eq(hash)) {
                    found = Some(identity.clone());
                }
            }
        }
        found
    }

    fn by_subject(&self, subject: &str) -> Option<Arc<Identity>> {
        self.0
            .iter()
            .find(|identity| identity.credential == Credential::CertSubject(subject.to_owned()))
            .cloned()
    }
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// The auth file in force, reloadable.
#[derive(Debug)]
pub(crate) struct Auth {
    path: PathBuf,
    identities: RwLock<Arc<Identities>>,
}

impl Auth {
    /// Loads the auth file at `path`.
    pub(crate) fn load(path: &Path) -> Result<Arc<Auth>, ServerError> {
        let identities = read(path).map_err(|detail| ServerError::Security {
            path: path.to_owned(),
            detail,
        })?;
        tracing::info!(path = %path.display(), identities = identities.0.len(), "authentication on");
        Ok(Arc::new(Auth {
            path: path.to_owned(),
            identities: RwLock::new(Arc::new(identities)),
        }))
    }

    /// Reads the file again; if it does not load, the previous one stays in
    /// force. Returns what was wrong, which is also logged.
    pub(crate) fn reload(&self) -> Result<(), String> {
        match read(&self.path) {
            Ok(identities) => {
                tracing::info!(
                    path = %self.path.display(),
                    identities = identities.0.len(),
                    "auth file reloaded"
                );
                *self.identities.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(identities);
                Ok(())
            }
            Err(detail) => {
                tracing::error!(
                    path = %self.path.display(),
                    %detail,
                    "auth file not reloaded, the previous one stays in force"
                );
                Err(detail)
            }
        }
    }

    fn current(&self) -> Arc<Identities> {
        self.identities
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn read(path: &Path) -> Result<Identities, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    Identities::parse(&text)
}

/// The credentials a request came with.
#[derive(Debug, Clone)]
enum Presented {
    Token([u8; 32]),
    Subject(String),
}

/// Who is calling, as far as the transport and metadata tell; checked against
/// the auth file in force at each decision.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// `None`: authentication is off, everything is allowed.
    auth: Option<(Arc<Auth>, Presented)>,
}

impl Caller {
    /// Identifies the caller of a request: with `auth` off, anyone; else by
    /// its bearer token, or if it sent none, by its client certificate.
    /// `UNAUTHENTICATED` if neither names an identity.
    pub(crate) fn of<T>(
        auth: Option<&Arc<Auth>>,
        request: &tonic::Request<T>,
    ) -> Result<Caller, Status> {
        let Some(auth) = auth else {
            return Ok(Caller { auth: None });
        };
        let certs = request.peer_certs();
        let presented = presented(request.metadata(), certs.as_ref().map(|c| c.as_slice()))?;
        let caller = Caller {
            auth: Some((auth.clone(), presented)),
        };
        caller.identity()?;
        Ok(caller)
    }

    /// The identity in the auth file now in force.
    fn identity(&self) -> Result<Option<Arc<Identity>>, Status> {
        let Some((auth, presented)) = &self.auth else {
            return Ok(None);
        };
        let identities = auth.current();
        let found = match presented {
            Presented::Token(hash) => identities.by_token(hash),
            Presented::Subject(subject) => identities.by_subject(subject),
        };
        match found {
            Some(identity) => Ok(Some(identity)),
            None => Err(Status::unauthenticated(match presented {
                Presented::Token(_) => "unknown token",
                Presented::Subject(_) => "the client certificate names no identity",
            })),
        }
    }

    /// Which names the caller may do `permission` to, for filtering a
    /// listing (the identity is looked up once).
    pub(crate) fn allowed(&self, permission: Permission) -> impl Fn(&str) -> bool {
        let identity = self.identity();
        move |name| match &identity {
            Ok(None) => true,
            Ok(Some(identity)) => identity.may(permission, name),
            Err(_) => false,
        }
    }

    /// `Ok` if the caller may do `permission` to every name in `names`, else
    /// `PERMISSION_DENIED` naming the first one it may not (or
    /// `UNAUTHENTICATED` if its identity left the auth file).
    pub(crate) fn check<'a>(
        &self,
        permission: Permission,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), Status> {
        let Some(identity) = self.identity()? else {
            return Ok(());
        };
        match names
            .into_iter()
            .find(|name| !identity.may(permission, name))
        {
            None => Ok(()),
            Some(name) => Err(Status::permission_denied(format!(
                "identity {:?} lacks {} on {name:?}",
                identity.name,
                permission.as_str()
            ))),
        }
    }

    /// `Ok` if the caller has `permission` on every name (a grant on the
    /// prefix `""`), for calls that reach beyond one name.
    pub(crate) fn check_all(&self, permission: Permission) -> Result<(), Status> {
        let Some(identity) = self.identity()? else {
            return Ok(());
        };
        if identity
            .grants
            .iter()
            .any(|(prefix, granted)| *granted == permission && prefix.is_empty())
        {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "identity {:?} lacks {} on every name (a grant on the prefix \"\")",
            identity.name,
            permission.as_str()
        )))
    }
}

/// What an auth file lists for a bearer token: its SHA-256, in hex.
pub fn token_sha256(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The credentials of a request: its bearer token if it sent one, else the
/// subject of its client certificate.
fn presented(
    metadata: &MetadataMap,
    certs: Option<&[rustls::pki_types::CertificateDer<'static>]>,
) -> Result<Presented, Status> {
    if let Some(value) = metadata.get("authorization") {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Status::unauthenticated("the authorization metadata is not `Bearer <token>`")
            })?;
        return Ok(Presented::Token(Sha256::digest(token.as_bytes()).into()));
    }
    if let Some(cert) = certs.and_then(|certs| certs.first()) {
        let cert = x509_cert::Certificate::from_der(cert.as_ref())
            .map_err(|_| Status::unauthenticated("the client certificate does not parse"))?;
        return Ok(Presented::Subject(cert.tbs_certificate.subject.to_string()));
    }
    Err(Status::unauthenticated(
        "authentication required: a bearer token or a client certificate",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; // "test"

    fn identities(text: &str) -> Result<Identities, String> {
        Identities::parse(text)
    }

    #[test]
    fn grants_are_by_prefix_and_permission() {
        let ids = identities(&format!(
            r#"
            [[identity]]
            name = "ci"
            token_sha256 = "{HASH}"
            grants = [ {{ prefix = "jobs/*", permissions = ["lock", "inspect"] }},
                       {{ prefix = "", permissions = ["inspect"] }} ]
            "#
        ))
        .unwrap();
        let ci = ids
            .by_token(&Sha256::digest(b"test").into())
            .expect("the token's hash");
        assert!(ci.may(Permission::Lock, "jobs/a"));
        assert!(!ci.may(Permission::Lock, "jobsx"));
        assert!(!ci.may(Permission::Lock, "orders/1"));
        assert!(ci.may(Permission::Inspect, "orders/1"));
        assert!(!ci.may(Permission::Admin, "jobs/a"));
        assert!(ids.by_token(&Sha256::digest(b"tesu").into()).is_none());
    }

    #[test]
    fn bad_files_say_why_without_secrets() {
        for (text, why) in [
            ("[[identity]]\nname = \"a\"\ngrants = []", "exactly one of"),
            (
                &format!("[[identity]]\nname = \"a\"\ntoken_sha256 = \"{HASH}\"\ncert_subject = \"CN=a\""),
                "exactly one of",
            ),
            ("[[identity]]\nname = \"a\"\ntoken_sha256 = \"abc\"", "64 hex digits"),
            (
                &format!("[[identity]]\nname = \"a\"\ntoken_sha256 = \"{HASH}\"\n[[identity]]\nname = \"b\"\ntoken_sha256 = \"{HASH}\""),
                "same credential",
            ),
            (
                "[[identity]]\nname = \"a\"\ncert_subject = \"CN=a\"\ngrants = [ { prefix = \"\", permissions = [\"own\"] } ]",
                "unknown variant",
            ),
            ("[[identity]]\nname = \"a\"\ncert_subject = \"CN=a\"\nextra = 1", "unknown field"),
        ] {
            let error = identities(text).unwrap_err();
            assert!(error.contains(why), "{error}");
            assert!(!error.contains(HASH), "{error}");
        }
    }
}
