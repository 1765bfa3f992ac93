//! What both hub modes use to let clusters join: the hub CAs ([`ca`], [`federation_ca`], on the
//! primitives of [`pki`]), bootstrap tokens ([`tokens`]), what a join does ([`join`]) and the
//! cluster store ([`store`]: the trait, and the file store of the standalone hub), and CA
//! rotation ([`rotation`]).
pub mod ca;
pub mod federation_ca;
pub mod join;
pub mod pki;
pub mod rotation;
pub mod store;
pub mod tokens;
