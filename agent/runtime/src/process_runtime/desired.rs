//! What the process runtime should run for a cluster's work: every SuperNode replica with its
//! arguments, environment, port and key, and each Federation's pools for its status.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use flower_addon_crds::DeploymentMode;
use flower_addon_proto::ClusterWork;

use super::input::{OwnedInput, input_owned};
use super::{
    DesiredReplica, PoolCount, PoolCounts, ProcessRuntime, ReplicaKey, io_err, network, port_free,
    write_if_changed,
};
use crate::node_key::ensure_node_key;
use crate::render::{self, ProcessReplica, SuperNodePoolInput};
use crate::runtime::RuntimeError;
use crate::work::FederationPlan;

/// A replica as the first pass plans it: its port when it runs already, what it renders from,
/// and its environment.
struct Planned {
    key: ReplicaKey,
    port: Option<u16>,
    owned: OwnedInput,
    insecure: bool,
    auth: bool,
    registered_keys: Vec<String>,
    retired_keys: Vec<String>,
    env: BTreeMap<String, String>,
}

impl ProcessRuntime {
    /// Every replica `work` asks for (running replicas keep their port from `taken_ports`), and
    /// each Federation's pools with their replica counts and the resource limits not enforced.
    pub(super) fn desired(
        &self,
        work: &ClusterWork,
        taken_ports: &BTreeMap<ReplicaKey, u16>,
    ) -> Result<(Vec<DesiredReplica>, PoolCounts), RuntimeError> {
        let mut pools = BTreeMap::new();
        let mut planned = Vec::new();
        for fed in &work.federations {
            let plan = crate::work::decode_federation(work, fed)
                .map_err(|e| RuntimeError::Apply(e.to_string()))?;
            let fed_pools = self.plan_federation(&plan, taken_ports, &mut planned)?;
            pools.insert((plan.namespace.clone(), plan.name.clone()), fed_pools);
        }
        // Second pass: ports (existing replicas keep theirs) and argv.
        let mut used: BTreeSet<u16> = planned.iter().filter_map(|p| p.port).collect();
        let mut next = self.config.port_base;
        let mut out = Vec::with_capacity(planned.len());
        for p in planned {
            let port = match p.port {
                Some(port) => port,
                None => {
                    while used.contains(&next) || !port_free(next) {
                        next = next.checked_add(1).ok_or_else(|| {
                            RuntimeError::Apply("no free port for a SuperNode".into())
                        })?;
                    }
                    used.insert(next);
                    next
                }
            };
            out.push(self.replica(p, port)?);
        }
        Ok((out, pools))
    }

    fn federation_dir(&self, namespace: &str, federation: &str) -> PathBuf {
        self.config
            .state_dir
            .join("federations")
            .join(namespace)
            .join(federation)
    }

    /// The first pass over one Federation: its CA bundle written, each replica of each pool
    /// planned (pushed to `planned`); its pools for the status.
    fn plan_federation(
        &self,
        plan: &FederationPlan,
        taken_ports: &BTreeMap<ReplicaKey, u16>,
        planned: &mut Vec<Planned>,
    ) -> Result<Vec<PoolCount>, RuntimeError> {
        let fed_dir = self.federation_dir(&plan.namespace, &plan.name);
        std::fs::create_dir_all(&fed_dir).map_err(io_err(&fed_dir))?;
        let ca_file = fed_dir.join("ca.crt");
        if let Some(pem) = &plan.ca_bundle_pem {
            write_if_changed(&ca_file, pem.as_bytes())?;
        }
        let mut fed_pools = Vec::new();
        for pool_plan in &plan.pools {
            let pool = &pool_plan.spec;
            let replicas = match plan.spec.mode {
                DeploymentMode::StatefulSet => pool.replicas.unwrap_or(1).max(0) as u32,
                // A device is one node: a DaemonSet pool runs once here.
                DeploymentMode::DaemonSet => 1,
            };
            let unenforced = render::unenforced_resources(pool);
            if !unenforced.is_empty() {
                tracing::warn!(federation = %plan.name, pool = %pool.name, fields = %unenforced.join(", "), "the process runtime does not enforce these resource limits");
            }
            fed_pools.push((pool.name.clone(), replicas, unenforced));
            let ca_secret = render::spoke_ca_secret_name(&plan.name);
            let input = SuperNodePoolInput {
                federation: &plan.name,
                namespace: &plan.namespace,
                spec: &plan.spec,
                pool,
                dialect: plan.dialect,
                version: plan.version,
                fleet_address: &plan.fleet_address,
                ca_secret_name: &ca_secret,
                cluster: &pool_plan.cluster,
            };
            for index in 0..replicas {
                let key = ReplicaKey {
                    namespace: plan.namespace.clone(),
                    federation: plan.name.clone(),
                    pool: pool.name.clone(),
                    index,
                };
                let mut env = render::process_env(&plan.spec, pool, index)
                    .map_err(|e| RuntimeError::Apply(format!("federation {}: {e}", plan.id())))?;
                // A new CA bundle restarts the SuperNode (it reads it once, at start).
                if let Some(digest) = plan.ca_digest() {
                    env.insert(crate::work::CA_DIGEST_ENV.to_owned(), digest);
                }
                // So does a new restart mark.
                if let Some(mark) = &plan.supernode_restart {
                    env.insert(crate::work::SUPERNODE_RESTART_ENV.to_owned(), mark.clone());
                }
                planned.push(Planned {
                    port: taken_ports.get(&key).copied(),
                    key,
                    owned: input_owned(&input, &pool_plan.cluster),
                    insecure: plan.spec.insecure,
                    auth: plan.spec.supernode_auth(),
                    registered_keys: plan.registered_node_keys.clone(),
                    retired_keys: plan.retired_node_keys.clone(),
                    env,
                });
            }
        }
        Ok(fed_pools)
    }

    /// A planned replica on `port`: its argv (with its key file when SuperNodes authenticate,
    /// the key made or kept), its SuperExec's argv in process isolation, and where it dials.
    fn replica(&self, p: Planned, port: u16) -> Result<DesiredReplica, RuntimeError> {
        let key = p.key;
        let fed_dir = self.fed_dir(&key);
        let ca_file = fed_dir.join("ca.crt");
        let input = p.owned.input();
        let replica = ProcessReplica {
            index: key.index,
            runtime_port: port,
            node_name: &self.config.node_name,
            root_certificates: (!p.insecure).then_some(ca_file.as_path()),
        };
        let mut argv = render::supernode_argv(&input, &replica)
            .map_err(|e| RuntimeError::Apply(e.to_string()))?;
        let mut public_key = None;
        if p.auth {
            let key_file = fed_dir
                .join("keys")
                .join(format!("{}-{}.key", key.pool, key.index));
            crate::node_key::retire_node_key(&key_file, &p.retired_keys);
            public_key =
                Some(ensure_node_key(&key_file).map_err(|e| RuntimeError::Apply(e.to_string()))?);
            argv.push("--auth-supernode-private-key".into());
            argv.push(key_file.display().to_string());
        }
        let superexec_argv = (p.owned.spec.isolation_mode
            == flower_addon_crds::IsolationMode::Process)
            .then(|| render::superexec_clientapp_argv(p.owned.version, port));
        let fleet_inside = self
            .bridge()
            .map(|_| network::fleet_inside(&p.owned.fleet_address))
            .transpose()
            .map_err(|e| {
                RuntimeError::Apply(format!(
                    "federation {}/{}: {e}",
                    key.namespace, key.federation
                ))
            })?;
        let registered = public_key
            .as_ref()
            .is_none_or(|k| p.registered_keys.iter().any(|r| r.trim() == k.trim()));
        Ok(DesiredReplica {
            registered,
            key,
            argv,
            env: p.env,
            superexec_argv,
            public_key,
            port,
            fleet_address: p.owned.fleet_address.clone(),
            fleet_inside,
        })
    }
}
