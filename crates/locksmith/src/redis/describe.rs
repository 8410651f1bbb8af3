//! Inspection: turning one name's keys into a [`LockInfo`].

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::Value;

use super::keys::owner_of;
use crate::backend::{Holder, LockInfo, Mode, Waiter};

/// locksmith's metadata of one holder.
struct Meta {
    token: u64,
    lock_time: u64,
    count: u32,
    lock_by: String,
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

fn items(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) | Value::Set(items) => items,
        _ => &[],
    }
}

fn pairs(value: &Value) -> Vec<(String, String)> {
    items(value)
        .chunks(2)
        .filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
        .collect()
}

fn parse_meta(value: &Value) -> HashMap<String, Meta> {
    pairs(value)
        .into_iter()
        .filter_map(|(field, v)| {
            let mut parts = v.splitn(4, ' ');
            let token = parts.next()?.parse().ok()?;
            let lock_time = parts.next()?.parse().ok()?;
            let count = parts.next()?.parse().ok()?;
            let lock_by = parts.next().unwrap_or_default().to_owned();
            Some((
                field,
                Meta {
                    token,
                    lock_time,
                    count,
                    lock_by,
                },
            ))
        })
        .collect()
}

fn wall(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Builds the [`LockInfo`] of `name` from the DESCRIBE script's answer.
pub(crate) fn lock_info(name: &str, reply: &Value) -> Option<LockInfo> {
    let parts = items(reply);
    let kind = text(parts.first()?)?;
    let pttl = int(parts.get(1)?)?;
    let now = int(parts.get(2)?)?.max(0) as u64;
    let body = parts.get(3)?;
    let meta = parse_meta(parts.get(4)?);
    let queue: Vec<String> = items(parts.get(5)?).iter().filter_map(text).collect();
    let live_waiters: HashMap<String, String> = pairs(parts.get(6)?).into_iter().collect();
    let permits = pairs(parts.get(7)?);
    let expires = (pttl > 0).then(|| wall(now + pttl as u64));
    let holder = |field: &str, mode: Mode, count: u32, expires: Option<SystemTime>| {
        let m = meta.get(field);
        Holder {
            owner: owner_of(field).to_owned(),
            lock_by: m.map(|m| m.lock_by.clone()).filter(|s| !s.is_empty()),
            lock_time: m.map(|m| wall(m.lock_time)),
            fencing_token: m.map(|m| m.token).filter(|&t| t > 0),
            lease_expires: expires,
            mode,
            hold_count: count,
        }
    };
    let mut holders = Vec::new();
    let mut waiter_mode = Mode::Exclusive;
    if !permits.is_empty()
        || kind == "string"
            && text(items(body).first().unwrap_or(&Value::Nil))
                .is_some_and(|v| v.parse::<i64>().is_ok())
    {
        // A semaphore: the name holds the available permits.
        let available = items(body).first().and_then(int).unwrap_or(0).max(0) as u32;
        let mode = Mode::Semaphore {
            permits: available + permits.len() as u32,
        };
        waiter_mode = mode;
        for (field, score) in &permits {
            let count = meta.get(field).map_or(1, |m| m.count);
            let until = score.parse::<f64>().ok().map(|s| wall(s as u64));
            holders.push(holder(field, mode, count, until));
        }
    } else if kind == "hash" {
        let fields = pairs(body);
        let reading = fields.iter().any(|(f, v)| f == "mode" && v == "read");
        let mode = if reading {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        for (field, value) in &fields {
            if field == "mode" {
                continue;
            }
            if let Ok(count) = value.parse::<u32>() {
                holders.push(holder(field, mode, count, expires));
            }
        }
    } else if kind == "string" {
        if let Some(value) = items(body).first().and_then(text) {
            let count = meta.get(&value).map_or(1, |m| m.count);
            holders.push(holder(&value, Mode::Exclusive, count, expires));
        }
    }
    holders.sort_by_key(|h| h.lock_time);
    let waiters: Vec<Waiter> = queue
        .iter()
        .filter(|id| live_waiters.contains_key(*id))
        .map(|id| Waiter {
            owner: owner_of(id).to_owned(),
            mode: waiter_mode,
            since: None,
        })
        .collect();
    if holders.is_empty() && waiters.is_empty() {
        return None;
    }
    Some(LockInfo {
        name: name.to_owned(),
        holders,
        waiters,
    })
}

/// Redlock: the holders a majority of nodes agree on.
pub(crate) fn agreed(name: &str, views: Vec<Option<LockInfo>>, quorum: usize) -> Option<LockInfo> {
    let mut counts: HashMap<(String, String), usize> = HashMap::new();
    for view in views.iter().flatten() {
        for h in &view.holders {
            *counts
                .entry((h.owner.clone(), h.mode.to_string()))
                .or_default() += 1;
        }
    }
    let mut holders: Vec<Holder> = Vec::new();
    for view in views.iter().flatten() {
        for h in &view.holders {
            let key = (h.owner.clone(), h.mode.to_string());
            if counts.get(&key).is_some_and(|&n| n >= quorum)
                && !holders
                    .iter()
                    .any(|x| x.owner == h.owner && x.mode == h.mode)
            {
                holders.push(h.clone());
            }
        }
    }
    (!holders.is_empty()).then(|| LockInfo {
        name: name.to_owned(),
        holders,
        waiters: Vec::new(),
    })
}
