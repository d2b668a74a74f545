//! Generates the dipam.v1 code. protoc comes from `protoc-bin-vendored`, so a fresh machine
//! needs nothing but cargo (docs/sources.md §12.3).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One proto package in two files: the Agent service has a file of its own so that other
    // languages can generate it alone (docs/agent-api.md); prost merges them into one module.
    let protos = ["dipam/v1/dipam.proto", "dipam/v1/agent.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut cfg = prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // The compiled descriptors of dipam.v1, which dipamd serves through gRPC server
    // reflection (shim-server/src/server.rs) so that grpcurl and other generic clients can
    // discover the API without a copy of proto/.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    cfg.file_descriptor_set_path(out.join("dipam_v1_descriptor.bin"));
    tonic_prost_build::configure()
        // The server half needs tonic's server feature; the plugin never builds it.
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .compile_with_config(cfg, &protos, &["."])?;
    Ok(())
}
