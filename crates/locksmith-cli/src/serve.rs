//! `locksmith serve` (being written).

/// Options of `locksmith serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

/// Runs the lock server until SIGINT/SIGTERM.
pub async fn serve(_args: ServeArgs) -> std::process::ExitCode {
    eprintln!("locksmith serve: not built yet");
    std::process::ExitCode::FAILURE
}
