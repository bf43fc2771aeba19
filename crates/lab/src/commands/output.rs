//! How a command prints its report: readable lines, then the report as JSON.

/// Prints `lines`, then `report`: as one JSON line when `json` is set, else pretty.
pub fn print_report<T: serde::Serialize>(lines: &[String], report: &T, json: bool) -> anyhow::Result<()> {
    for line in lines {
        println!("{line}");
    }
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", serde_json::to_string_pretty(report)?);
    }
    Ok(())
}
