//! Micro-benchmarks live in `records.rs` (`cargo bench -p durafiber-benches`); the macro
//! benchmarks with baselines are `durafiber bench stash|recover|alarms`.
