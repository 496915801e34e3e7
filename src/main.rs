//! The one `svc` executable: argv[0] picks the mode (see `svc::dispatch`).

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    std::process::exit(svc::dispatch::main(args));
}
