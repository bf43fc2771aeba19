//! The server's HTTP JSON API ([`server`]) and the client the CLI uses ([`client`]).
