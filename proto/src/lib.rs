//! The flower-addon work channel (`flower.addon.v1`): Join, Renew and the Connect stream.
#![forbid(unsafe_code)]
