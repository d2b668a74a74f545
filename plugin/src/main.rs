//! `dipam`: the CNI plugin binary. Everything lives in the library; this only wires the
//! process environment and standard streams to it (tests inject their own).

use std::io::IsTerminal;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let getenv = |key: &str| std::env::var(key).ok();
    let stdin = std::io::stdin();
    // An operator who runs `CNI_COMMAND=VERSION dipam` by hand gets an answer instead of a
    // read that waits for a config nobody will type.
    let mut input: Box<dyn std::io::Read> = if stdin.is_terminal() {
        Box::new(std::io::empty())
    } else {
        Box::new(stdin.lock())
    };
    // stderr is not locked for the whole run: the datapath's netns threads log to it while
    // this thread waits for them (a held lock would deadlock the first such message).
    let code = dipam_plugin::run(
        &args,
        &getenv,
        &mut input,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr(),
    );
    std::process::exit(code);
}
