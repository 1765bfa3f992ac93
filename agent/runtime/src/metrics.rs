//! The agent's metrics (`flower_addon_agent_*`), process-wide like controller-runtime's registry:
//! the work channel, the runtimes and the process supervisor record into [`agent`], and
//! `flower-agent run` serves [`registry`] on `--metrics-bind-address`.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::LazyLock;
use std::time::Duration;

/// The outcome label of a counted operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// The program label of supervised processes (`flower-supernode`, `flower-superexec`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabels {
    /// The program's file name.
    pub program: String,
}

/// Every agent metric.
#[derive(Debug)]
pub struct AgentMetrics {
    /// Work snapshots applied, by result.
    pub applies: Family<ResultLabels, Counter>,
    /// How long applying one snapshot took.
    pub apply_duration: Histogram,
    /// 1 while the work stream to the hub is open.
    pub hub_connected: Gauge,
    /// 1 while the last connection failed on certificate trust (the agent's
    /// `channel::locked_out`).
    pub hub_locked_out: Gauge,
    /// Times the work stream opened.
    pub hub_connects: Counter,
    /// Supervised processes running now, by program.
    pub supervised: Family<ProgramLabels, Gauge>,
    /// Restarts of supervised processes (exits and failed starts), by program.
    pub restarts: Family<ProgramLabels, Counter>,
    /// Resident memory, set at each scrape.
    pub resident_memory: Gauge,
}

/// Latency buckets from 1 ms to ~65 s (doubling).
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

static AGENT: LazyLock<AgentMetrics> = LazyLock::new(|| AgentMetrics {
    applies: Family::default(),
    apply_duration: Histogram::new(latency_buckets()),
    hub_connected: Gauge::default(),
    hub_locked_out: Gauge::default(),
    hub_connects: Counter::default(),
    supervised: Family::default(),
    restarts: Family::default(),
    resident_memory: Gauge::default(),
});

/// The process's agent metrics.
pub fn agent() -> &'static AgentMetrics {
    &AGENT
}

impl AgentMetrics {
    /// Records one applied snapshot.
    pub fn applied(&self, ok: bool, took: Duration) {
        self.applies
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
        self.apply_duration.observe(took.as_secs_f64());
    }

    /// Records whether the last connection failed because this agent and the hub no longer
    /// trust each other's certificate.
    pub fn locked_out(&self, locked: bool) {
        self.hub_locked_out.set(i64::from(locked));
    }

    /// Records whether the work stream is open.
    pub fn connected(&self, open: bool) {
        self.hub_connected.set(i64::from(open));
        if open {
            self.hub_connects.inc();
        }
    }
}

/// The label of a supervised `program` path run with `args`: its file name, or that of the
/// program a `netns-bridge` runs (`… netns-bridge … -- PROGRAM …`), which is what it supervises.
pub fn program_label(program: &std::path::Path, args: &[String]) -> ProgramLabels {
    let bridged = match args.first().map(String::as_str) {
        Some("netns-bridge") => args
            .iter()
            .position(|a| a == "--")
            .and_then(|at| args.get(at + 1)),
        _ => None,
    };
    let program = bridged.map_or(program, |p| std::path::Path::new(p.as_str()));
    ProgramLabels {
        program: program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// A registry of the agent metrics, as `flower-agent run` serves them.
pub fn registry() -> Registry {
    let m = agent();
    let mut registry = Registry::default();
    registry.register(
        "flower_addon_agent_applies",
        "Work snapshots from the hub applied by the runtime, by result",
        m.applies.clone(),
    );
    registry.register(
        "flower_addon_agent_apply_duration_seconds",
        "How long applying one work snapshot took",
        m.apply_duration.clone(),
    );
    registry.register(
        "flower_addon_agent_hub_connected",
        "1 while the work stream to the hub is open, else 0",
        m.hub_connected.clone(),
    );
    registry.register(
        "flower_addon_agent_hub_locked_out",
        "1 while connections fail because this agent and the hub no longer trust each other's certificate (join again; the log says how), else 0",
        m.hub_locked_out.clone(),
    );
    registry.register(
        "flower_addon_agent_hub_connects",
        "Times the work stream to the hub opened",
        m.hub_connects.clone(),
    );
    register_processes(&mut registry, "flower_addon_agent");
    register_resident_memory(&mut registry);
    registry
}

/// Registers the supervisor's gauges and counters (`<prefix>_supervised_processes`,
/// `<prefix>_process_restarts_total`); the standalone hub exports them too.
pub fn register_processes(registry: &mut Registry, prefix: &str) {
    let m = agent();
    registry.register(
        format!("{prefix}_supervised_processes"),
        "Supervised child processes running now, by program",
        m.supervised.clone(),
    );
    registry.register(
        format!("{prefix}_process_restarts"),
        "Restarts of supervised child processes (exits and failed starts), by program",
        m.restarts.clone(),
    );
}

/// Registers `process_resident_memory_bytes` (the name Prometheus client libraries use), set by
/// [`refresh`].
pub fn register_resident_memory(registry: &mut Registry) {
    registry.register(
        "process_resident_memory_bytes",
        "Resident memory size in bytes",
        agent().resident_memory.clone(),
    );
}

/// Sets the scrape-time gauges (resident memory).
pub fn refresh() {
    if let Some(bytes) = crate::ops::resident_memory_bytes() {
        agent().resident_memory.set(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridged_program_is_labelled_as_itself() {
        let plain = program_label(std::path::Path::new("/venv/bin/flower-supernode"), &[]);
        assert_eq!(plain.program, "flower-supernode");
        let args: Vec<String> = [
            "netns-bridge",
            "--import=9092=f.sock",
            "--",
            "/venv/bin/flower-supernode",
            "--insecure",
        ]
        .map(String::from)
        .to_vec();
        let bridged = program_label(std::path::Path::new("/usr/bin/flower-agent"), &args);
        assert_eq!(bridged.program, "flower-supernode");
    }
}
