//! The configuration's parsing and validation.
use super::*;

#[test]
fn the_cache_and_the_http_timeouts_are_settings() {
    let c = RuntimeConfig::from_json(
        r#"{"cache": "16MiB", "http_header_timeout": "3s", "http_body_timeout": "2s"}"#,
    )
    .expect("config");
    assert_eq!(c.store_config().expect("store config").cache_bytes, 16 * 1024 * 1024);
    assert_eq!(
        (c.http_header_timeout, c.http_body_timeout),
        (Duration::from_secs(3), Duration::from_secs(2))
    );
    assert!(RuntimeConfig::from_json(r#"{"cache": "lots"}"#).is_err());
    assert!(RuntimeConfig::from_json(r#"{"http_body_timeout": "0s"}"#).is_err());
    assert_eq!(RuntimeConfig::default().store_config().expect("store config").cache_bytes, 192 * 1024 * 1024);
}

#[test]
fn the_defaults_are_the_contracts() {
    let c = RuntimeConfig::default();
    c.validate().unwrap();
    assert_eq!(c.evict_after_range().unwrap(), (Duration::from_secs(70), Duration::from_secs(140)));
}

#[test]
fn sizes_read_the_way_people_write_them() {
    assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
    assert_eq!(parse_bytes("10MB").unwrap(), 10_000_000);
    assert_eq!(parse_bytes("4096").unwrap(), 4096);
    assert!(parse_bytes("64 parsecs").is_err());
    assert!(parse_bytes("99999999999999GiB").is_err());
}

#[test]
fn a_config_file_reads_like_the_contract() {
    let c = RuntimeConfig::from_json(r#"{"hibernate_after": "2m", "evict_after": "1m..3m"}"#).unwrap();
    assert_eq!(c.hibernate_after, Duration::from_secs(120));
    assert!(RuntimeConfig::from_json(r#"{"hibernate_afte": "2m"}"#).is_err());
    assert!(RuntimeConfig::from_json(r#"{"keep_alive_heartbeat": "5m"}"#).is_err());
    assert_eq!(RuntimeConfig::from_json(r#"{"alarm_window": 1000}"#).unwrap().alarm_window, 1000);
    let skew = RuntimeConfig::from_json(r#"{"max_clock_skew": "250ms"}"#).unwrap().max_clock_skew;
    assert_eq!(skew, Duration::from_millis(250));
    let tiny = RuntimeConfig::from_json(r#"{"alarm_window": 2}"#);
    assert!(matches!(tiny, Err(RuntimeError::Config(m)) if m.contains("alarm_window")));
}
