//! `trip-v2`: the next deploy of the trip agent — a reworded progress line and a new stash
//! version, which every run waiting across the deploy survives.

#[path = "../trip/common.rs"]
mod common;
#[path = "../trip/v2.rs"]
mod v2;

fn main() {
    durafiber::cli::main(|builder| builder.agent(v2::Trip::<2>))
}
