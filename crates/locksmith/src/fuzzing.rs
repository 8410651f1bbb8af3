//! Entry point of the fuzz targets in `fuzz/` (feature `fuzzing`; not part
//! of the API): the parsing of backend URLs, without connecting.

use crate::client::Store;
use crate::error::Result;
use crate::options::{redact, ConnectOptions};

/// Parses `url` with the parser of its scheme, as [`crate::Client::connect`]
/// would, contacting nothing; also redacts it, as every error message does.
/// A scheme without a parser (`memory`, unknown ones) is `Ok`.
pub fn parse_url(url: &str) -> Result<()> {
    let _ = redact(url);
    let options = ConnectOptions::default();
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    match Store::of_scheme(scheme) {
        Some(Store::Server) => crate::server::parse_url_only(url, &options),
        Some(Store::Redis) => crate::redis::parse_url_only(url, &options),
        Some(Store::ZooKeeper) => crate::zookeeper::parse_url_only(url, &options),
        Some(Store::Etcd) => crate::etcd::parse_url_only(url, &options),
        Some(Store::Postgres) => crate::postgres::parse_url_only(url, &options),
        Some(Store::Memory) | None => Ok(()),
    }
}
