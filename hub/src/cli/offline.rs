//! Offline commands: `crds`, `validate`, `render`. They read files and print; no cluster needed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use flower_addon_crds::Object;

use crate::cli::spoke::{SpokeSelection, spoke_objects};
use crate::core::render::{ExternalAddressError, HubRenderError, render_hub, spoke_fleet_address};

/// Arguments of `flower-hub validate`.
#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// YAML files holding Federation, Placement, PlacementDecision or ManagedCluster objects
    /// (multi-document streams allowed).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The hub admin's pod policy the Federations are judged by (as `flower-hub serve`'s).
    #[command(flatten)]
    pub policy: crate::cli::policy::HubPolicyArgs,
}

/// Arguments of `flower-hub render`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Without --cluster: what the hub applies in its own cluster — the SuperLink StatefulSet and \
Service, plus the SuperNode pools of Federations without placementRef (their {cluster} is \
\"local-cluster\"). With --cluster: the objects that spoke's agent applies for Federations with \
placementRef, computed by the same code as the running hub and agent. Give the Placement's \
PlacementDecisions (and ManagedClusters, for labels) among the files to get exactly the hub's \
split; without them the cluster is taken at --cluster-index of --clusters, the others running \
the same pools. Secrets holding certificates (the SuperLink TLS Secret, the spokes' CA Secret \
<fed>-superlink-ca) are issued by a running hub and are not printed; a comment names them.")]
pub struct RenderArgs {
    /// YAML files holding Federation (and Placement) objects.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Render what this spoke cluster's agent would apply (default: what the hub applies).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Position of the cluster among the selected clusters (0-based).
    #[arg(long, requires = "cluster", default_value_t = 0)]
    pub cluster_index: u32,
    /// Number of selected clusters.
    #[arg(long, requires = "cluster", default_value_t = 1)]
    pub clusters: u32,
    /// Address of the hub cluster's nodes (as given to `flower-hub serve --node-address`), for
    /// the Fleet address of a NodePort Federation without `externalAddress` (its fleet node port
    /// must then be pinned in `spec.superlink.service.nodePorts.grpc` to be known offline).
    #[arg(long, requires = "cluster")]
    pub node_address: Option<String>,
    /// A label of the cluster (`key=value`, repeatable), as on its ManagedCluster (used when
    /// the files hold no ManagedCluster of that name): pools are narrowed by their
    /// `clusterSelector` and `spec.clusterOverrides` are merged in, exactly as the hub does.
    /// Without labels the cluster has none: pools with a `clusterSelector` are not shown.
    #[arg(long = "label", requires = "cluster", value_parser = flower_addon_runtime::cli::parse_pair)]
    pub labels: Vec<(String, String)>,
    /// The hub admin's pod policy the Federations are judged by (as `flower-hub serve`'s).
    #[command(flatten)]
    pub policy: crate::cli::policy::HubPolicyArgs,
}

/// `flower-hub crds`.
pub fn crds() -> anyhow::Result<ExitCode> {
    print!("{}", flower_addon_crds::crds_yaml());
    Ok(ExitCode::SUCCESS)
}

/// Reads every object of a YAML stream with [`flower_addon_crds::parse_documents`]. The error is
/// one stderr-ready line naming the file (and the line, where known).
pub fn read_objects(path: &Path) -> Result<Vec<Object>, String> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    flower_addon_crds::parse_documents(&shown, &text).map_err(|e| e.to_string())
}

/// `flower-hub validate`.
pub fn validate(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let policy = args.policy.policy()?;
    let mut problems = 0usize;
    for file in &args.files {
        let shown = file.display();
        let objects = match read_objects(file) {
            Ok(objects) => objects,
            Err(err) => {
                eprintln!("{err}");
                problems += 1;
                continue;
            }
        };
        for object in &objects {
            for (path, message) in object_problems(object, &policy) {
                eprintln!("{shown}: {path}: {message}");
                problems += 1;
            }
        }
    }
    Ok(if problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Validation problems of one object as `(field path, message)`: the CRD rules first; when they
/// pass, what the renderer would still refuse, then what the hub's pod `policy` refuses.
pub fn object_problems(
    object: &Object,
    policy: &flower_addon_crds::policy::PodPolicy,
) -> Vec<(String, String)> {
    match object {
        Object::Federation(fed) => crate::core::problems::problems(fed, policy),
        Object::Placement(placement) => flower_addon_crds::validate_placement(placement)
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect(),
        Object::ManagedClusterSet(set) => flower_addon_crds::validate_cluster_set(set)
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect(),
        Object::ManagedClusterSetBinding(binding) => {
            flower_addon_crds::validate_cluster_set_binding(binding)
                .into_iter()
                .map(|e| (e.path, e.message))
                .collect()
        }
        Object::FlowerRun(run) => flower_addon_crds::validate_flower_run(run)
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect(),
        Object::PlacementDecision(_) | Object::ManagedCluster(_) | Object::ConfigMap(_) => {
            Vec::new()
        }
    }
}

/// `flower-hub render`.
pub fn render(args: RenderArgs) -> anyhow::Result<ExitCode> {
    if args.cluster.is_some() && args.cluster_index >= args.clusters {
        anyhow::bail!(
            "--cluster-index {} must be smaller than --clusters {}",
            args.cluster_index,
            args.clusters
        );
    }
    let policy = args.policy.policy()?;
    let mut all = Vec::new();
    let mut invalid = false;
    for file in &args.files {
        let objects = match read_objects(file) {
            Ok(objects) => objects,
            Err(err) => {
                eprintln!("{err}");
                invalid = true;
                continue;
            }
        };
        for object in objects {
            let problems = object_problems(&object, &policy);
            for (path, message) in &problems {
                eprintln!("{}: {path}: {message}", file.display());
            }
            invalid |= !problems.is_empty();
            all.push(object);
        }
    }
    if invalid {
        return Ok(ExitCode::FAILURE);
    }
    let spoke = args.cluster.as_deref().map(|cluster| SpokeArgs {
        cluster,
        index: args.cluster_index,
        clusters: args.clusters,
        labels: args.labels.iter().cloned().collect(),
    });
    print!(
        "{}",
        render_stream(&all, spoke.as_ref(), args.node_address.as_deref())?
    );
    Ok(ExitCode::SUCCESS)
}

/// The spoke `render --cluster` prints.
#[derive(Clone, Debug)]
pub struct SpokeArgs<'a> {
    /// Cluster name.
    pub cluster: &'a str,
    /// Its position among the selected clusters (when no PlacementDecision is given).
    pub index: u32,
    /// Number of selected clusters (when no PlacementDecision is given).
    pub clusters: u32,
    /// Its labels (when its ManagedCluster is not given).
    pub labels: BTreeMap<String, String>,
}

/// The YAML stream `render` prints for the Federations among `objects`: the hub side, or one
/// spoke's side (selected by the PlacementDecisions among `objects`, else by position).
pub fn render_stream(
    objects: &[Object],
    spoke: Option<&SpokeArgs<'_>>,
    node_address: Option<&str>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let federations = objects.iter().filter_map(|o| match o {
        Object::Federation(fed) => Some(fed),
        _ => None,
    });
    for fed in federations {
        let name = fed.metadata.name.as_deref().unwrap_or_default();
        let (values, secret_note) = match spoke {
            None => {
                let objects = render_hub(fed).with_context(|| format!("Federation {name}"))?;
                let mut values = objects.to_values()?;
                let local = super::spoke::hub_local_objects(fed)
                    .with_context(|| format!("Federation {name}"))?;
                if let Some(local) = &local {
                    values.extend(super::spoke::printed(local)?);
                }
                let note = (!fed.spec.insecure).then(|| {
                    let mut note = format!(
                        "# Secret {} (tls.crt, tls.key, ca.crt) is issued by the hub CA at run time; not shown.\n",
                        crate::core::render::superlink_tls_secret_name(fed)
                    );
                    if local.is_some() {
                        note.push_str(&format!(
                            "# Secret {} (ca.crt) and, with SuperNode authentication, each pool's node key Secret are made in the hub cluster at run time; not shown.\n",
                            flower_addon_crds::render::spoke_ca_secret_name(name)
                        ));
                    }
                    note
                });
                (values, note)
            }
            Some(cluster) => {
                let fleet = match spoke_fleet_address(fed, node_address) {
                    _ if fed.spec.placement_ref.is_none() => None,
                    Ok(fleet) => Some(fleet),
                    Err(HubRenderError::ExternalAddress(ExternalAddressError::NoNodeAddress)) => {
                        anyhow::bail!(
                            "Federation {name}: spec.superlink.externalAddress is not set: pass --node-address HOST (what flower-hub serve is given) to render the NodePort address spokes dial"
                        )
                    }
                    Err(HubRenderError::ExternalAddress(ExternalAddressError::Pending(_))) => {
                        anyhow::bail!(
                            "Federation {name}: the Fleet address is known only once Kubernetes assigns it (a node port or a load balancer); pin spec.superlink.service.nodePorts.grpc or set spec.superlink.externalAddress to render it offline"
                        )
                    }
                    Err(e) => return Err(e).with_context(|| format!("Federation {name}")),
                };
                let selection =
                    SpokeSelection::from_decisions(fed, cluster.cluster, objects, &cluster.labels)
                        .unwrap_or_else(|| {
                            SpokeSelection::positional(
                                cluster.cluster,
                                cluster.index,
                                cluster.clusters,
                                &cluster.labels,
                            )
                        });
                let rendered = match fleet {
                    Some(fleet) => spoke_objects(fed, &selection, &fleet, "")
                        .with_context(|| format!("Federation {name}"))?,
                    None => None,
                };
                let note = rendered.as_ref().filter(|_| !fed.spec.insecure).map(|_| {
                    format!(
                        "# Secret {} (ca.crt) is created by the agent from the hub's CA bundle; not shown.\n",
                        flower_addon_crds::render::spoke_ca_secret_name(name)
                    )
                });
                let values = match &rendered {
                    Some(rendered) => super::spoke::printed(rendered)?,
                    None => Vec::new(),
                };
                (values, note)
            }
        };
        if let Some(note) = secret_note {
            out.push_str(&note);
        }
        for value in values {
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&value)?);
        }
    }
    Ok(out)
}
