//! dipamd: see `dipamd --help` and docs/cfp.md. All logic is in the dipam-shim library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = dipam_shim::daemon::Args::parse();
    dipam_shim::daemon::tune_allocator();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dipamd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(dipam_shim::daemon::run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dipamd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
