//! `trip-v2-conflict`: a deploy that must not go out — it books another number of nights
//! for a booking runs already made, which `check-deploy` names before any run is touched.

#[path = "../trip/common.rs"]
mod common;
#[path = "../trip/v2.rs"]
mod v2;

fn main() {
    durafiber::cli::main(|builder| builder.agent(v2::Trip::<3>))
}
