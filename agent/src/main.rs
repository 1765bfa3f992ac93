fn main() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("install the rustls ring crypto provider");
}
