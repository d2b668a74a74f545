//! dipamctl: see `dipamctl --help`. All logic is in the dipam-shim library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = dipam_shim::ctl::Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dipamctl: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(dipam_shim::ctl::run(args, &mut std::io::stdout().lock())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dipamctl: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
