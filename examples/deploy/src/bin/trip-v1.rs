//! `trip-v1`: the trip agent as first deployed, behind every durafiber command.

#[path = "../trip/common.rs"]
mod common;
#[path = "../trip/v1.rs"]
mod v1;

fn main() {
    durafiber::cli::main(|builder| builder.agent(v1::Trip))
}
