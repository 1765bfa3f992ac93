//! Applying YAML manifests to a cluster (server-side apply), the CRDs and the hub manifests.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};

use crate::harness::wait_until;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, ResourceExt};

/// Field manager used by the harness for everything it applies.
pub const FIELD_MANAGER: &str = "flower-addon-e2e";

/// Parses a multi-document YAML string into objects (empty documents are skipped).
pub fn parse_yaml(yaml: &str) -> Result<Vec<DynamicObject>> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).context("parsing multi-document YAML")?;
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| serde_json::from_value(d).context("a YAML document is not a Kubernetes object"))
        .collect()
}

/// The `Api` for an object, resolved by discovery of its `apiVersion`/`kind`; namespaced objects
/// without a namespace go to `default_namespace`.
pub async fn api_for(
    client: &Client,
    obj: &DynamicObject,
    default_namespace: &str,
) -> Result<Api<DynamicObject>> {
    let types = obj
        .types
        .as_ref()
        .with_context(|| format!("object {} has no apiVersion/kind", obj.name_any()))?;
    let gvk = GroupVersionKind::try_from(types)
        .with_context(|| format!("bad apiVersion {:?}", types.api_version))?;
    let (ar, caps) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {}/{}", types.api_version, types.kind))?;
    Ok(match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &ar),
        Scope::Namespaced => {
            let ns = obj
                .namespace()
                .unwrap_or_else(|| default_namespace.to_string());
            Api::namespaced_with(client.clone(), &ns, &ar)
        }
    })
}

/// Which documents to apply and how.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions<'a> {
    /// Apply only documents of these kinds (`None`: all).
    pub kinds: Option<&'a [&'a str]>,
    /// Server-side dry run (`dryRun=All`): validated and admitted, not stored.
    pub dry_run: bool,
}

/// Server-side applies one object (forced, [`FIELD_MANAGER`]); returns what the apiserver stored
/// (or would store, with `dry_run`).
pub async fn apply_object(
    client: &Client,
    obj: &DynamicObject,
    default_namespace: &str,
    dry_run: bool,
) -> Result<DynamicObject> {
    let api = api_for(client, obj, default_namespace).await?;
    let name = obj.name_any();
    let mut obj = obj.clone();
    obj.metadata.managed_fields = None;
    obj.metadata.resource_version = None;
    let mut pp = PatchParams::apply(FIELD_MANAGER).force();
    pp.dry_run = dry_run;
    api.patch(&name, &pp, &Patch::Apply(&obj))
        .await
        .map_err(anyhow::Error::from)
}

/// Server-side applies the selected documents of a YAML string, in order.
pub async fn apply_yaml_with(
    client: &Client,
    yaml: &str,
    default_namespace: &str,
    opts: ApplyOptions<'_>,
) -> Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    for obj in parse_yaml(yaml)? {
        let kind = obj
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        if opts.kinds.is_some_and(|ks| !ks.contains(&kind.as_str())) {
            continue;
        }
        let name = obj.name_any();
        out.push(
            apply_object(client, &obj, default_namespace, opts.dry_run)
                .await
                .with_context(|| format!("applying {kind} {name}"))?,
        );
    }
    Ok(out)
}

/// Server-side applies every document of a YAML string, in order.
pub async fn apply_yaml(
    client: &Client,
    yaml: &str,
    default_namespace: &str,
) -> Result<Vec<DynamicObject>> {
    apply_yaml_with(client, yaml, default_namespace, ApplyOptions::default()).await
}

/// Server-side applies the selected documents of a YAML file, in order.
pub async fn apply_file_with(
    client: &Client,
    path: &Path,
    default_namespace: &str,
    opts: ApplyOptions<'_>,
) -> Result<Vec<DynamicObject>> {
    let yaml =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    apply_yaml_with(client, &yaml, default_namespace, opts)
        .await
        .with_context(|| format!("applying {}", path.display()))
}

/// Server-side applies every document of a YAML file, in order.
pub async fn apply_file(
    client: &Client,
    path: &Path,
    default_namespace: &str,
) -> Result<Vec<DynamicObject>> {
    apply_file_with(client, path, default_namespace, ApplyOptions::default()).await
}

/// Server-side applies every generated CRD and waits until each is Established.
pub async fn install_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let generated = flower_addon_crds::crds();
    ensure!(!generated.is_empty(), "flower_addon_crds::crds() is empty");
    for crd in &generated {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => anyhow!("apiserver refused CRD {name}: {}", s.message),
            e => anyhow::Error::from(e),
        })?;
    }
    for crd in &generated {
        let name = crd.name_any();
        let crds = crds.clone();
        wait_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            || {
                let crds = crds.clone();
                let name = name.clone();
                async move {
                    let c = crds.get(&name).await?;
                    let conds = c.status.and_then(|s| s.conditions).unwrap_or_default();
                    Ok(conds
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Installs the hub as the README says: the CRDs, then `manifests/hub/` (namespace, RBAC, the
/// cluster-set binding policy, Deployment, Service) into `flower-addon-system`.
pub async fn install_hub_manifests(client: &Client) -> Result<()> {
    install_crds(client).await?;
    let manifests = crate::repo_root().join("manifests/hub");
    for file in [
        "namespace.yaml",
        "rbac.yaml",
        "clusterset-binding-policy.yaml",
        "deployment.yaml",
        "service.yaml",
    ] {
        apply_file(client, &manifests.join(file), "flower-addon-system").await?;
    }
    Ok(())
}

/// The node port of the first port of `service` (a NodePort or LoadBalancer Service).
pub fn first_node_port(service: &k8s_openapi::api::core::v1::Service) -> Result<i32> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .and_then(|p| p.node_port)
        .with_context(|| format!("Service {} has no nodePort", service.name_any()))
}
