//! The `sless` binary's code as a library: the server's wiring ([`serve`]) and its
//! configuration file ([`config`]), its
//! connection handling ([`accept`], [`tls`]) and the command-line client ([`cli`]), so tests
//! can build a server in-process and drive it without spawning the binary.

pub mod accept;
pub mod cli;
pub mod config;
pub mod serve;
pub mod tls;
