//! `locksmith session list|end`: the sessions of a locksmith server, for
//! administrators (a session a client abandoned keeps its holds until its
//! TTL; `end` takes them away now).
//!
//! Sessions are the server's own notion (the other stores have none to
//! list), so this talks to the server's gRPC API directly: `ListSessions` and
//! `EndSession`.

use std::process::ExitCode;
use std::time::Duration;

use comfy_table::{presets::ASCII_NO_BORDERS, Table};
use locksmith::server::{ServerUrl, Stub};
use locksmith_proto::v1 as pb;
use pb::locksmith_client::LocksmithClient;

use crate::common::fail;
use crate::status::printable;

/// Options of `locksmith session`.
#[derive(Debug, clap::Args)]
pub struct SessionArgs {
    #[command(subcommand)]
    command: SessionCommand,
    /// The server: locksmith://host[:port] or locksmith+tls://…?ca=FILE (with
    /// several members, the first is asked); the token comes from
    /// `LOCKSMITH_TOKEN` or `?token_file=FILE`.
    #[arg(
        long,
        global = true,
        env = "LOCKSMITH_BACKEND",
        default_value = "locksmith://127.0.0.1:7420"
    )]
    backend: String,
}

#[derive(Debug, clap::Subcommand)]
enum SessionCommand {
    /// Show every open session: client, host, address, holds, expiry.
    List,
    /// End sessions now: their holds are lost and their waiters dropped.
    End {
        /// Session ids as `session list` and the server log show them (hex).
        #[arg(required = true, value_parser = parse_session_id)]
        ids: Vec<u64>,
    },
}

/// Runs `locksmith session`.
///
/// Cancel safety: `list` only reads; dropped during `end`, the session being
/// ended may or may not have been, and the later ids are not tried.
pub async fn session(args: SessionArgs) -> ExitCode {
    let mut client = match connect(&args.backend).await {
        Ok(client) => client,
        Err(message) => return fail(&message),
    };
    match args.command {
        SessionCommand::List => match client.list_sessions(pb::ListSessionsRequest {}).await {
            Ok(response) => {
                println!("{}", render(&response.into_inner()));
                ExitCode::SUCCESS
            }
            Err(status) => fail(&status.message()),
        },
        SessionCommand::End { ids } => {
            let mut code = ExitCode::SUCCESS;
            for id in ids {
                let request = pb::EndSessionRequest { session_id: id };
                match client.end_session(request).await {
                    Ok(_) => eprintln!("locksmith: ended session {id:016x}"),
                    Err(status) => code = fail(&status.message()),
                }
            }
            code
        }
    }
}

/// A client of the first member the URL names, over its transport and with
/// its credentials.
///
/// Cancel safety: safe (a dropped connect leaves nothing behind).
async fn connect(url: &str) -> Result<Stub, String> {
    let parsed = ServerUrl::parse(url).map_err(|e| e.to_string())?;
    let first = &parsed.addresses()[0];
    let channel = parsed
        .endpoint(first)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {first}: {e}"))?;
    Ok(
        LocksmithClient::with_interceptor(channel, parsed.credentials())
            .max_decoding_message_size(256 << 20),
    )
}

pub fn parse_session_id(text: &str) -> Result<u64, String> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    u64::from_str_radix(digits, 16).map_err(|e| format!("{text}: not a session id ({e})"))
}

pub fn render(list: &pb::ListSessionsResponse) -> Table {
    let mut table = Table::new();
    table.load_style(ASCII_NO_BORDERS).set_header([
        "SESSION",
        "CLIENT",
        "HOST",
        "ADDRESS",
        "CONNECTED",
        "TTL",
        "EXPIRES IN",
        "HOLDS",
    ]);
    let seconds = |ms: u64| format!("{:.1}s", ms as f64 / 1000.0);
    for s in &list.sessions {
        table.add_row([
            format!("{:016x}", s.session_id),
            printable(&s.client_name).into_owned(),
            printable(&s.host).into_owned(),
            if s.peer.is_empty() {
                "-".into()
            } else {
                printable(&s.peer).into_owned()
            },
            if s.connected { "yes" } else { "no" }.into(),
            seconds(s.ttl_ms),
            seconds(s.expires_at_ms.saturating_sub(list.now_ms)),
            s.holds.to_string(),
        ]);
    }
    table
}
