//! The deploy example (`examples/deploy`), a crate outside the workspace that depends only
//! on `durafiber`, built as a user would build it: once per test process, into its own
//! target directory. Its binaries: `expenses`, and the trip agent's successive deploys
//! `trip-v1`, `trip-v2` and `trip-v2-conflict`.

use durafiber_testkit::process::OutputWithin;
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

/// How long a build of the example may take before the test gives up on it.
const BUILD_DEADLINE: Duration = Duration::from_secs(1200);

/// The example's binary `name`, the whole example built once per test process.
pub fn example_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/deploy/Cargo.toml");
        // The test binary is target/<profile>/deps/<name>: the target directory is three up.
        let exe = std::env::current_exe().expect("test binary path");
        let target = exe.ancestors().nth(3).expect("target directory").join("deploy-example");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        eprintln!("building examples/deploy into {} (a few minutes on a fresh machine)", target.display());
        let out = Command::new(cargo)
            .args(["build", "--locked", "--bins", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .output_within(BUILD_DEADLINE)
            .expect("run cargo build for examples/deploy");
        assert!(
            out.status.success(),
            "examples/deploy does not build:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("debug")
    });
    dir.join(name)
}
