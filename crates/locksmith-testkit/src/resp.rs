//! A minimal blocking RESP2 client, enough to ping and poke a Redis in tests.
//!
//! It talks over the server's Unix socket, which every testkit Redis opens
//! beside its port: plain RESP also where clients must speak TLS, and also
//! when a network fault cuts the server's port off.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A reply from Redis (RESP2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RespValue {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Integer(i64),
    /// `$3\r\nfoo` or `$-1` (`None`).
    Bulk(Option<Vec<u8>>),
    /// `*2 ...` or `*-1` (`None`).
    Array(Option<Vec<RespValue>>),
}

impl RespValue {
    /// The text of a simple string or a UTF-8 bulk string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            RespValue::Simple(s) => Some(s),
            RespValue::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The value of an integer reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            RespValue::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// Whether this is a nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, RespValue::Bulk(None) | RespValue::Array(None))
    }
}

/// Sends one command to the Redis listening on the Unix socket `socket` on a
/// fresh connection and reads the reply, giving up after `timeout` per read
/// or write.
pub(crate) fn query(socket: &Path, args: &[&str], timeout: Duration) -> io::Result<RespValue> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    (&stream).write_all(&request)?;
    read_value(&mut BufReader::new(stream))
}

fn read_value(reader: &mut impl BufRead) -> io::Result<RespValue> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(1.min(line.len()));
    let number = || {
        rest.parse::<i64>()
            .map_err(|_| invalid(format!("bad number in reply line {line:?}")))
    };
    Ok(match kind {
        "+" => RespValue::Simple(rest.to_owned()),
        "-" => RespValue::Error(rest.to_owned()),
        ":" => RespValue::Integer(number()?),
        "$" => match number()? {
            n if n < 0 => RespValue::Bulk(None),
            n => {
                let mut bytes = vec![0; n as usize + 2];
                reader.read_exact(&mut bytes)?;
                bytes.truncate(n as usize);
                RespValue::Bulk(Some(bytes))
            }
        },
        "*" => match number()? {
            n if n < 0 => RespValue::Array(None),
            n => RespValue::Array(Some(
                (0..n)
                    .map(|_| read_value(reader))
                    .collect::<io::Result<_>>()?,
            )),
        },
        _ => return Err(invalid(format!("unexpected reply line {line:?}"))),
    })
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> RespValue {
        read_value(&mut &bytes[..]).unwrap()
    }

    #[test]
    fn parses_every_reply_kind() {
        assert_eq!(parse(b"+PONG\r\n").as_str(), Some("PONG"));
        assert_eq!(parse(b"-ERR no\r\n"), RespValue::Error("ERR no".into()));
        assert_eq!(parse(b":42\r\n").as_int(), Some(42));
        assert_eq!(parse(b"$3\r\nfoo\r\n").as_str(), Some("foo"));
        assert!(parse(b"$-1\r\n").is_nil());
        assert_eq!(
            parse(b"*2\r\n$1\r\na\r\n:1\r\n"),
            RespValue::Array(Some(vec![
                RespValue::Bulk(Some(b"a".to_vec())),
                RespValue::Integer(1)
            ]))
        );
    }
}
