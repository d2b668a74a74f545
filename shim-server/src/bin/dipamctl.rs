//! dipamctl: see `dipamctl --help`. All logic is in the dipam-shim library (`ctl/`).

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
    let result = rt.block_on(dipam_shim::ctl::run(args, &mut std::io::stdout().lock()));
    dipam_shim::ctl::output::exit(result)
}
