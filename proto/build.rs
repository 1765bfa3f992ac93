//! Generates the tonic/prost code for `flower.addon.v1` with protox (no system `protoc`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/flower/addon/v1/registration.proto",
        "proto/flower/addon/v1/work.proto",
        // Flower's own Control API (the messages the hub uses), client only.
        "proto/flwr/proto/control.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
