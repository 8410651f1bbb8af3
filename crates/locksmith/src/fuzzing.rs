//! Entry point of the fuzz targets in `fuzz/` (feature `fuzzing`; not part
//! of the API): the parsing of backend URLs, without connecting.

use crate::client::{redact, ConnectOptions};
use crate::error::Result;

/// Parses `url` with the parser of its scheme, as [`crate::Client::connect`]
/// would, contacting nothing; also redacts it, as every error message does.
/// A scheme without a parser (`memory`, unknown ones) is `Ok`.
pub fn parse_url(url: &str) -> Result<()> {
    let _ = redact(url);
    let options = ConnectOptions::default();
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    match scheme {
        "locksmith" => crate::server::parse_url_only(url, &options),
        "redis" | "rediss" | "redis+redlock" | "redis+sentinel" | "rediss+sentinel"
        | "redis+cluster" | "rediss+cluster" => crate::redis::parse_url_only(url, &options),
        "zk" | "zookeeper" => crate::zookeeper::parse_url_only(url, &options),
        "etcd" => crate::etcd::parse_url_only(url, &options),
        "postgres" | "postgresql" => crate::postgres::parse_url_only(url, &options),
        _ => Ok(()),
    }
}
