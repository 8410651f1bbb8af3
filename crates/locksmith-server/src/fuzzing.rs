//! Entry points of the fuzz targets in `fuzz/` (feature `fuzzing`; not part
//! of the API): the server's handling of bytes that come from outside the
//! process (a client's request, a peer's Raft message, a leader's snapshot,
//! the data directory), each reachable without a running server.

use std::path::Path;

use locksmith_core::{ClientInfo, Command, Engine, SessionId};
use locksmith_proto::prost::Message;
use locksmith_proto::v1 as pb;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use openraft::type_config::alias::{SnapshotMetaOf, VoteOf};

use crate::config::ServerConfig;
use crate::entry::TypeConfig;
use crate::error::ServerError;
use crate::history::{History, HistoryLimits};
use crate::service::fuzzing::{stream_message, unary_requests};
use crate::storage::member::{MemberDir, StoredSnapshot};
use crate::storage::ServerSnapshot;

/// `bytes` as a client's request: decoded as a session stream's batch, whose
/// messages go through the stream's checks and conversion (acquires on to a
/// lock engine), and as each unary call's request, through its checks.
pub fn client_request(bytes: &[u8]) {
    let config = ServerConfig::in_memory();
    if let Ok(batch) = pb::ClientBatch::decode(bytes) {
        let mut engine = Engine::new(config.limits.clone());
        let open = Command::OpenSession {
            session: SessionId(1),
            ttl: config.limits.min_ttl,
            info: ClientInfo::default(),
        };
        engine
            .apply(0, open, &mut Vec::new())
            .expect("a new engine opens a session");
        for message in batch.messages {
            stream_message(&config, message.kind, &mut engine);
        }
    }
    unary_requests(&config, bytes);
}

/// `bytes` as the payload of a peer's Raft call (append, vote, leader
/// transfer) or the header of a snapshot it sends.
pub fn peer_request(bytes: &[u8]) {
    let _ = postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(bytes);
    let _ = postcard::from_bytes::<VoteRequest<TypeConfig>>(bytes);
    let _ = postcard::from_bytes::<TransferLeaderRequest<TypeConfig>>(bytes);
    let _ = postcard::from_bytes::<(VoteOf<TypeConfig>, SnapshotMetaOf<TypeConfig>)>(bytes);
}

/// `bytes` as a snapshot's data (a leader's, installed) and as a member's
/// stored snapshot: decoded and, when it decodes, restored into a lock
/// engine and the grant history, as an install does.
pub fn snapshot(bytes: &[u8]) {
    if let Ok(stored) = postcard::from_bytes::<StoredSnapshot>(bytes) {
        install(&stored.data);
    }
    install(bytes);
}

fn install(data: &[u8]) {
    let Ok(state) = ServerSnapshot::decode(data) else {
        return;
    };
    let config = ServerConfig::in_memory();
    let mut history = History::new(HistoryLimits {
        per_lock: config.history_per_lock,
        total: config.history_total,
        max_age: config.history_max_age.as_millis() as u64,
    });
    history.restore(&state.engine);
    // An inconsistent snapshot is refused; a consistent one must restore
    // into an engine that takes commands.
    let Ok(mut engine) = Engine::restore(config.limits, state.engine) else {
        return;
    };
    let _ = engine.snapshot();
    // Everything comes due: sessions, leases and waits expire, lock-delays
    // end, and the waiters left are granted, through what the snapshot set up.
    let now = u64::MAX / 4;
    let mut effects = Vec::new();
    for command in engine.due(now) {
        let _ = engine.apply(now, command, &mut effects);
    }
}

/// Opens `data_dir` as a start does (with `recover`, as
/// `--recover-damaged-data` does), and closes it again.
pub fn open_data_dir(data_dir: &Path, recover: bool) -> Result<(), ServerError> {
    let mut config = ServerConfig::durable(data_dir);
    config.recover_damaged_data = recover;
    MemberDir::open(data_dir, &config).map(drop)
}
