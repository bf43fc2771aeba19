//! Every default and every maximum of the runtime, each with its reason.

use std::time::Duration;

/// A stash is a snapshot, not a database: 1 MiB keeps a boundary's barrier short.
pub const STASH_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// A run's output stream (`ctx.emit`) holds at most this much chunk data by default.
pub const STREAM_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;
/// Chunks a stream reader reads from the store at a time.
pub const STREAM_READ_PAGE: usize = 256;
/// Inputs, messages, effect args, approval payloads and alarm payloads share one bound.
pub const PAYLOAD_BYTES_MAX: usize = 1024 * 1024;
/// The most runs one `list` call returns.
pub const LIST_PAGE_MAX: usize = durafiber_api::LIST_PAGE_MAX;
/// Runs read per page by the recovery scan at start-up.
pub const RECOVERY_SCAN_PAGE_MAX: usize = 4096;
/// Recovery hook attempts before a run is escalated (§3.6).
pub const RECOVER_ATTEMPTS_MAX_DEFAULT: u32 = 5;
/// First recovery backoff; it doubles per failed attempt.
pub const RECOVER_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Recovery backoff never exceeds five minutes.
pub const RECOVER_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A recovery hook running this long without settling no longer holds a suspect's lone
/// recovery back (`kernel/hook_gate.rs`): the process has survived it this long.
pub const HOOK_SETTLE_MAX: Duration = Duration::from_secs(1);
/// A suspect's lone recovery running this long without settling no longer holds other
/// recoveries back: no run waits behind one whose hook hangs.
pub const PROBE_ALONE_MAX: Duration = Duration::from_secs(10);
/// How soon a recovery that the hook gate held back asks again.
pub const HOOK_GATE_RETRY: Duration = Duration::from_millis(20);
/// How long a suspect that asked for its lone recovery keeps new hooks from starting, so
/// that the hooks running drain and it gets its turn.
pub const PROBE_ASK_HOLD: Duration = Duration::from_millis(500);
/// A run found interrupted after this age is escalated, not resumed.
pub const MAX_AGE_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// Effect calls per re-entry before the failure reaches the fiber (§5.5).
pub const EFFECT_ATTEMPTS_MAX: u32 = 3;
/// Full-jitter backoff of effect retries: from 100 ms ...
pub const EFFECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// ... to 3 s.
pub const EFFECT_BACKOFF_MAX: Duration = Duration::from_secs(3);
/// A human has three days before silence escalates (§6.1).
pub const ESCALATE_AFTER_DEFAULT: Duration = Duration::from_secs(72 * 3600);
/// Alarm deliveries: the first attempt plus six retries (§8.4).
pub const ALARM_ATTEMPTS_MAX: u32 = 7;
/// Retry n of an alarm waits this × 2^(n-1), plus up to 25% jitter.
pub const ALARM_RETRY_BASE: Duration = Duration::from_secs(2);
/// A handler that runs longer than this has failed.
pub const ALARM_WALL_LIMIT_DEFAULT: Duration = Duration::from_secs(15 * 60);
/// Backoff after the runtime's own failures (a store write) is capped here and not counted.
pub const ALARM_RUNTIME_BACKOFF_MAX: Duration = Duration::from_secs(1024);
/// The furthest ahead an alarm may be due, and the longest period: every time computed from
/// a due time stays far from `u64::MAX` ms, so no arithmetic on it can wrap.
pub const ALARM_HORIZON_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// The shortest period of a periodic alarm: ten deliveries a second. A shorter one is
/// refused, naming this limit (a period of 1 ms was thousands of deliveries a second, each a
/// boundary, for as long as the run lived).
pub const ALARM_PERIOD_MIN: Duration = Duration::from_millis(100);
/// An `on_message` handler running longer than this has failed, and its caller is answered.
pub const MESSAGE_WALL_LIMIT_DEFAULT: Duration = Duration::from_secs(60);
/// A durability barrier that has not returned after this long fails the store.
pub const BARRIER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// How often a waiter (`wait`, a stream reader) looks again on a store several nodes share,
/// where the run may be written by another node.
pub const SHARED_STORE_POLL: Duration = Duration::from_millis(100);
/// How long a node's lease on its shards lasts without a renewal (a shared store).
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);
/// How far a node's clock may be from the database's before it takes no shard: a second is
/// far more than NTP leaves, and far less than any wait a run sets.
pub const MAX_CLOCK_SKEW_DEFAULT: Duration = Duration::from_secs(1);
/// After SIGTERM, requests get this long to finish and the store this long to close: a
/// server stops within twice this, whatever the disk does.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Undelivered events one run may hold; a send past it is refused.
pub const EVENT_BUFFER_MAX: usize = 1_000;
/// Bytes of undelivered events one run may hold.
pub const EVENT_BUFFER_BYTES_MAX: usize = 4 * 1024 * 1024;
/// A storage key is at most 2 KiB.
pub const STORAGE_KEY_BYTES_MAX: usize = 2 * 1024;
/// A storage value (as JSON) is at most 128 KiB, as in Durable Objects.
pub const STORAGE_VALUE_BYTES_MAX: usize = 128 * 1024;
/// Keys one run may hold in its storage, unless configured otherwise.
pub const STORAGE_KEYS_MAX_DEFAULT: usize = 100_000;
/// Boundaries a run keeps in its history by default (`history_max`).
pub const HISTORY_MAX_DEFAULT: u32 = 32;
/// The most entries one storage `list` returns.
pub const STORAGE_LIST_MAX: usize = 10_000;
/// Lock stripes that serialize activation, hibernation and eviction per run, and as many
/// that serialize the writes of a run record: recovery deals runs into lanes by stripe.
/// A run's boundary holds its stripe while its commit waits, and a recovery batch takes
/// the stripes of its 256 runs: with 1,024 stripes, 100,000 recovered runs stashing faster
/// than the disk could take kept each stripe busy, and the recovery of the rest queued
/// behind them (a recovery of 100,000 runs that stash every 200 ms: 46–49 s; with 16,384,
/// 15–17 s). About 1.5 MiB for both sets.
pub const ACTIVATION_STRIPES: usize = 16_384;
/// Alarms the scheduler keeps in memory by default (`RuntimeConfig::alarm_window`); the
/// rest wait in the store's due index. A few MiB: a burst of this many alarms due
/// together fires without the index being read meanwhile.
pub const ALARM_WINDOW_DEFAULT: usize = 16_384;
/// The smallest `alarm_window` accepted: a window of a few entries would read the index
/// for nearly every delivery.
pub const ALARM_WINDOW_MIN: usize = 64;
/// Most alarms one refill of the window reads: short reads, more often, so a refill never
/// holds a core (or the window) for long while alarms are being picked up.
pub const ALARM_REFILL_MAX: usize = 512;
/// How long a run's actor outlives its last event: a run whose events come closer together
/// keeps one actor, as a spawn and a stop cost about 50 µs of latency per event (sequential
/// messages to one run); a burst of alarms to many runs keeps only the last moment's actors.
pub const ACTOR_IDLE_GRACE: Duration = Duration::from_millis(100);
/// Alarm deliveries in flight at once, so a burst cannot flood the actors' mailboxes.
pub const ALARM_DELIVERIES_IN_FLIGHT_MAX: usize = 2048;
/// Events kept in memory for timelines and the `events` view.
pub const EVENT_LOG_MAX: usize = 65_536;
/// Idle and hibernateable for this long: the run hibernates.
pub const HIBERNATE_AFTER_DEFAULT: Duration = Duration::from_secs(10);
/// Fibers waiting on a durable wait kept in memory at most, by default. A waiting fiber
/// costs about 4.5 KB of heap (its future, its cell, its entries in the run maps);
/// re-entering a parked run when its wait ends costs a recovery (`bench idle`).
pub const WAITING_IN_MEMORY_DEFAULT: usize = 10_000;
/// Idle but not hibernateable: evicted after a draw from this range ...
pub const EVICT_AFTER_MIN_DEFAULT: Duration = Duration::from_secs(70);
/// ... to this.
pub const EVICT_AFTER_MAX_DEFAULT: Duration = Duration::from_secs(140);
/// A held keep-alive counts as activity this often.
pub const KEEP_ALIVE_HEARTBEAT_DEFAULT: Duration = Duration::from_secs(30);

const _: () = assert!(EFFECT_BACKOFF_MIN.as_millis() < EFFECT_BACKOFF_MAX.as_millis());
const _: () = assert!(RECOVER_BACKOFF_BASE.as_millis() < RECOVER_BACKOFF_MAX.as_millis());
const _: () = assert!(EVICT_AFTER_MIN_DEFAULT.as_millis() <= EVICT_AFTER_MAX_DEFAULT.as_millis());
// A heartbeat must come before the earliest eviction, or a held keep-alive would not protect.
const _: () = assert!(KEEP_ALIVE_HEARTBEAT_DEFAULT.as_millis() < EVICT_AFTER_MIN_DEFAULT.as_millis());
const _: () = assert!(STASH_BYTES_MAX_DEFAULT <= PAYLOAD_BYTES_MAX);

/// Largest HTTP request body the server reads; a larger one is 413.
pub const HTTP_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Longest request target (path and query); a longer one is 414.
pub const HTTP_URI_BYTES_MAX: usize = 8 * 1024;
/// Most bytes of request headers; more is 431.
pub const HTTP_HEADER_BYTES_MAX: usize = 16 * 1024;
/// A client must send a request's headers within this time by default
/// (`http_header_timeout`), and an idle connection is closed after it: a slow or silent
/// client holds nothing for long.
pub const HTTP_HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The fewest connections a server is sized for (`http_connections_max`), whatever its
/// file-descriptor limit: past its connections, a few more are taken to answer `/health`
/// only ([`HTTP_HEALTH_CONNECTIONS_MAX`]) and the rest are closed on accept.
pub const HTTP_CONNECTIONS_MIN: usize = 256;
/// The most connections a server is sized for from its file-descriptor limit: an idle
/// connection costs a few kilobytes, a busy one its buffers.
pub const HTTP_CONNECTIONS_SIZED_MAX: usize = 16_384;
/// File descriptors left for everything but connections when the server sizes its
/// connections from the limit: the store's files, the log, PostgreSQL connections, the
/// peer client, child processes.
pub const FDS_KEPT_FOR_FILES: u64 = 1_024;
/// The share of connections, in percent, kept for callers who present a valid token or
/// console session: once the rest are taken, a connection is served only for such a caller
/// (checked on its headers, before any body is read), so addresses that hold stalled
/// requests cannot keep an admin out.
pub const HTTP_SIGNED_IN_PERCENT: usize = 25;
/// Time a connection kept for the signed-in has for its request's headers (at most
/// `http_header_timeout`).
pub const HTTP_SIGNED_IN_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Connections beyond the server's own that are answered only on `/health` (503 to
/// anything else): a server whose slots are held still says how it is.
pub const HTTP_HEALTH_CONNECTIONS_MAX: usize = 32;
/// Most connections one client address may hold open at once: one client cannot take the
/// slots of all the others.
pub const HTTP_CONNECTIONS_PER_CLIENT_MAX: usize = 64;
/// Time a client has, by default, to send a request's whole body once its headers are in
/// (`http_body_timeout`); a body still coming after it is refused with 408 and the
/// connection closed.
pub const HTTP_BODY_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(5);
const _: () = assert!(HTTP_CONNECTIONS_PER_CLIENT_MAX < HTTP_CONNECTIONS_MIN);

/// Interrupted runs re-activated side by side at start-up, in lanes of one batch each: enough
/// lanes that some compute while others wait for their barrier, few enough to bound the
/// memory of a large recovery (`bench recover`: 8 lanes beat 4 and 16 on two cores).
pub const RECOVERY_ACTIVATIONS_MAX: usize = 2048;
/// Interrupted runs re-activated as one batch, their registrations one write.
pub const RECOVERY_BATCH_MAX: usize = 256;

/// Most console sessions signed in at once; the oldest is signed out to make room.
pub const CONSOLE_SESSIONS_MAX: usize = 4_096;
/// How long a console session lasts after sign-in.
pub const CONSOLE_SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// Spans are sent at most this long after they end, by default (`traces.export_every`).
pub const TRACE_EXPORT_EVERY_DEFAULT: std::time::Duration = std::time::Duration::from_secs(1);
/// Spans that may wait to be sent, by default (`traces.queue_max`): about 8 MiB at most.
pub const TRACE_QUEUE_MAX_DEFAULT: usize = 8_192;
/// How long one export of spans may take, by default (`traces.timeout`).
pub const TRACE_EXPORT_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest wait an upstream's `Retry-After` can impose on an effect's next call: a
/// misconfigured or hostile upstream asking for days does not hold a run that long.
pub const RETRY_AFTER_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// How long a call holds a named limit's slot in a shared store without renewing it: a node
/// that dies frees its slots this long after its last renewal (every third of it).
pub const LIMIT_SLOT_TTL: Duration = Duration::from_secs(10);

/// How often a call waiting for a named limit's slot in a shared store asks again.
pub const LIMIT_SLOT_POLL: Duration = Duration::from_millis(20);

/// How long a join first waits for its child's end before it reads the child's state again
/// (the end's event can be lost to a crash); each later wait is twice as long.
pub const JOIN_RECHECK_FIRST: Duration = Duration::from_secs(60);

/// The longest a join waits before it reads its child's state again.
pub const JOIN_RECHECK_MAX: Duration = Duration::from_secs(3_600);
