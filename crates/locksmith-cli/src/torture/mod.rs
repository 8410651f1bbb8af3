//! `locksmith torture` (being written).

/// Options of `locksmith torture`.
#[derive(Debug, clap::Args)]
pub struct TortureArgs {}

/// Runs the fault-injection checker.
pub async fn torture(_args: TortureArgs) -> std::process::ExitCode {
    eprintln!("locksmith torture: not built yet");
    std::process::ExitCode::FAILURE
}
