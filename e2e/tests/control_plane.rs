//! Real control plane (hub + 2 spokes): workloads run through kwok, and the install manifests'
//! RBAC is accepted by real apiservers and grants exactly what the hub and agent need.
//! One control plane is shared by all scenarios of this binary (started once, ended by pid).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::{Access, ApplyOptions, Cluster, ControlPlane, SaAccess, can_i, service_account_access};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

type Scenario = for<'a> fn(&'a ControlPlane) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

/// Runs every scenario (even after a failure) and fails listing each failed one.
async fn run_all(cp: &ControlPlane, scenarios: &[(&str, Scenario)]) {
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        let t = Instant::now();
        eprintln!("=== scenario {name}");
        let res = scenario(cp).await;
        let secs = t.elapsed().as_secs_f64();
        match res {
            Ok(()) => eprintln!("=== scenario {name}: ok ({secs:.1}s)"),
            Err(e) => {
                eprintln!("=== scenario {name}: FAILED ({secs:.1}s): {e:#}");
                failed.push(format!("{name}: {e:#}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "failed scenarios:\n{}",
        failed.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_control_plane() {
    // Invariant: the harness brings up hub + 2 spokes whose pods really run (kwok), and the
    // install manifests' RBAC works on real apiservers.
    e2e::install_crypto();
    let cp = ControlPlane::start(&["hub", "spoke-1", "spoke-2"])
        .await
        .expect("control plane (run e2e/k8s/build.sh if binaries are missing)");
    eprintln!(
        "control plane startup {:.1}s; RSS:\n{}",
        cp.startup.as_secs_f64(),
        cp.rss_report()
    );
    run_all(
        &cp,
        &[
            ("statefulset_ready_through_kwok", |cp| {
                Box::pin(statefulset_ready_through_kwok(cp))
            }),
            ("clusters_are_isolated", |cp| {
                Box::pin(clusters_are_isolated(cp))
            }),
            ("hub_rbac_least_privilege", |cp| {
                Box::pin(hub_rbac_least_privilege(cp))
            }),
            ("agent_rbac_least_privilege", |cp| {
                Box::pin(agent_rbac_least_privilege(cp))
            }),
            ("manifests_accepted_dry_run", |cp| {
                Box::pin(manifests_accepted_dry_run(cp))
            }),
            ("roles_for_people", |cp| Box::pin(roles_for_people(cp))),
            ("binding_a_cluster_set_needs_bind", |cp| {
                Box::pin(binding_a_cluster_set_needs_bind(cp))
            }),
        ],
    )
    .await;
    eprintln!("RSS after scenarios:\n{}", cp.rss_report());
}

/// A 2-replica StatefulSet on spoke-1 reaches readyReplicas=2: controller-manager makes pods,
/// the scheduler binds them to kwok nodes, kwok marks them Running/Ready; delete really deletes.
async fn statefulset_ready_through_kwok(cp: &ControlPlane) -> Result<()> {
    let spoke = cp.cluster("spoke-1")?;
    let sts: Api<StatefulSet> = Api::namespaced(spoke.client.clone(), "default");
    let obj: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "smoke"},
        "spec": {
            "replicas": 2,
            "serviceName": "smoke",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "smoke"}},
            "template": {
                "metadata": {"labels": {"app": "smoke"}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]}
            }
        }
    }))?;
    sts.create(&PostParams::default(), &obj).await?;
    let took = e2e::wait_until(
        "StatefulSet smoke 2/2 ready",
        Duration::from_secs(90),
        || {
            let sts = sts.clone();
            async move {
                let s = sts.get("smoke").await?;
                Ok(s.status.and_then(|s| s.ready_replicas) == Some(2))
            }
        },
    )
    .await?;
    eprintln!("  StatefulSet 2/2 ready in {:.1}s", took.as_secs_f64());
    let pods: Api<Pod> = Api::namespaced(spoke.client.clone(), "default");
    let lp = ListParams::default().labels("app=smoke");
    for p in pods.list(&lp).await?.items {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        ensure!(
            spoke.nodes.contains(&node),
            "pod {:?} on unexpected node {node:?}",
            p.metadata.name
        );
    }
    sts.delete("smoke", &DeleteParams::background()).await?;
    e2e::wait_until("smoke pods gone", Duration::from_secs(90), || {
        let pods = pods.clone();
        let lp = lp.clone();
        async move { Ok(pods.list(&lp).await?.items.is_empty()) }
    })
    .await?;
    Ok(())
}

/// The three apiservers share one etcd but not their data: each sees only its own nodes.
async fn clusters_are_isolated(cp: &ControlPlane) -> Result<()> {
    for c in cp.clusters() {
        let mut names = e2e::cluster::node_names(&c.client).await?;
        names.sort();
        ensure!(
            names == c.nodes,
            "{}: nodes {names:?}, expected {:?}",
            c.name,
            c.nodes
        );
    }
    Ok(())
}

fn manifest(rel: &str) -> std::path::PathBuf {
    e2e::repo_root().join("manifests").join(rel)
}

async fn check(admin: &Cluster, sa: &SaAccess, rules: &[(bool, Access<'_>)]) -> Result<()> {
    let mut wrong = Vec::new();
    for (want, what) in rules {
        let got = can_i(&admin.client, sa, what).await?;
        if got != *want {
            wrong.push(format!("{what:?}: allowed={got}, expected {want}"));
        }
    }
    if !wrong.is_empty() {
        bail!("{} on {}:\n  {}", sa.user(), admin.name, wrong.join("\n  "));
    }
    Ok(())
}

fn a<'a>(verb: &'a str, group: &'a str, resource: &'a str, ns: Option<&'a str>) -> Access<'a> {
    Access {
        verb,
        group,
        resource,
        subresource: None,
        namespace: ns,
    }
}

/// The hub's ServiceAccount (manifests/hub/rbac.yaml) can do its job and nothing more, both per
/// SubjectAccessReview and with a client using its own token.
async fn hub_rbac_least_privilege(cp: &ControlPlane) -> Result<()> {
    let hub = cp.cluster("hub")?;
    apply_namespace(hub, "hub/namespace.yaml").await?;
    let sa = service_account_access(
        hub,
        &manifest("hub/rbac.yaml"),
        "flower-addon-system",
        "flower-hub",
        3600,
    )
    .await?;
    let g = "flower-addon.io";
    let mut status = a("patch", g, "federations", Some("team-a"));
    status.subresource = Some("status");
    let mut mc_status = a("update", g, "managedclusters", None);
    mc_status.subresource = Some("status");
    let mut run_status = a("patch", g, "flowerruns", Some("team-a"));
    run_status.subresource = Some("status");
    let mut run_finalizers = a("update", g, "flowerruns", Some("team-a"));
    run_finalizers.subresource = Some("finalizers");
    check(
        hub,
        &sa,
        &[
            (true, a("list", g, "federations", None)),
            (true, a("watch", g, "placements", None)),
            (true, a("watch", g, "managedclustersets", None)),
            (true, a("list", g, "managedclustersetbindings", None)),
            (
                false,
                a("create", g, "managedclustersetbindings", Some("team-a")),
            ),
            (false, a("create", g, "managedclustersets", None)),
            (true, status),
            (true, mc_status),
            (true, a("create", g, "placementdecisions", Some("team-a"))),
            (true, a("create", g, "managedclusters", None)),
            (true, a("list", "apps", "statefulsets", None)),
            (true, a("patch", "apps", "statefulsets", Some("team-a"))),
            (true, a("create", "", "services", Some("team-a"))),
            (true, a("create", "", "secrets", Some("team-a"))),
            (true, a("create", "", "events", Some("team-a"))),
            (true, a("create", "", "namespaces", None)),
            (
                true,
                a(
                    "update",
                    "coordination.k8s.io",
                    "leases",
                    Some("flower-addon-system"),
                ),
            ),
            (
                false,
                a(
                    "update",
                    "coordination.k8s.io",
                    "leases",
                    Some("kube-system"),
                ),
            ),
            (false, a("delete", "", "nodes", None)),
            (false, a("delete", "", "namespaces", None)),
            (false, a("create", "", "pods", Some("team-a"))),
            (false, a("create", "apps", "deployments", Some("team-a"))),
            (false, a("update", g, "federations", Some("team-a"))),
            // FlowerRuns: followed (watch), their status and finalizer written, deleted after
            // their TTL; never created. Their FABs are read from ConfigMaps, never written.
            (true, a("watch", g, "flowerruns", None)),
            (true, a("patch", g, "flowerruns", Some("team-a"))),
            (true, a("delete", g, "flowerruns", Some("team-a"))),
            (true, run_status),
            (true, run_finalizers),
            (false, a("create", g, "flowerruns", Some("team-a"))),
            (true, a("get", "", "configmaps", Some("team-a"))),
            (true, a("watch", "", "configmaps", None)),
            (false, a("create", "", "configmaps", Some("team-a"))),
            (false, a("delete", "", "configmaps", Some("team-a"))),
            (
                false,
                a(
                    "create",
                    "rbac.authorization.k8s.io",
                    "clusterrolebindings",
                    None,
                ),
            ),
            (
                false,
                a(
                    "create",
                    "apiextensions.k8s.io",
                    "customresourcedefinitions",
                    None,
                ),
            ),
        ],
    )
    .await?;
    // The same with the SA's own token: list allowed, node delete forbidden.
    let sts: Api<StatefulSet> = Api::all(sa.client.clone());
    sts.list(&ListParams::default())
        .await
        .context("hub SA lists statefulsets")?;
    let nodes: Api<Node> = Api::all(sa.client.clone());
    let node = &hub.nodes[0];
    match nodes.delete(node, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => bail!("hub SA deleting node {node}: expected 403 Forbidden, got {other:?}"),
    }
}

/// The agent's ServiceAccount (manifests/agent/rbac.yaml) on a spoke can manage pool workloads
/// and their Secrets, read pods, and nothing more.
async fn agent_rbac_least_privilege(cp: &ControlPlane) -> Result<()> {
    let spoke = cp.cluster("spoke-1")?;
    apply_namespace(spoke, "agent/namespace.yaml").await?;
    let sa = service_account_access(
        spoke,
        &manifest("agent/rbac.yaml"),
        "flower-addon-agent",
        "flower-agent",
        3600,
    )
    .await?;
    check(
        spoke,
        &sa,
        &[
            (true, a("list", "apps", "statefulsets", None)),
            (true, a("patch", "apps", "statefulsets", Some("team-a"))),
            (true, a("delete", "apps", "daemonsets", Some("team-a"))),
            (true, a("create", "", "secrets", Some("team-a"))),
            (true, a("create", "", "namespaces", None)),
            (true, a("list", "", "pods", Some("team-a"))),
            (true, a("list", "", "nodes", None)),
            (false, a("delete", "", "pods", Some("team-a"))),
            (false, a("create", "", "pods", Some("team-a"))),
            (false, a("delete", "", "nodes", None)),
            (false, a("delete", "", "namespaces", None)),
            (false, a("create", "apps", "deployments", Some("team-a"))),
            // The headless Service each StatefulSet pool names in serviceName.
            (true, a("create", "", "services", Some("team-a"))),
            (true, a("delete", "", "services", Some("team-a"))),
            (false, a("create", "", "configmaps", Some("team-a"))),
            (
                false,
                a(
                    "create",
                    "rbac.authorization.k8s.io",
                    "roles",
                    Some("team-a"),
                ),
            ),
            (false, a("list", "flower-addon.io", "federations", None)),
        ],
    )
    .await?;
    let sts: Api<StatefulSet> = Api::all(sa.client.clone());
    sts.list(&ListParams::default())
        .await
        .context("agent SA lists statefulsets")?;
    let nodes: Api<Node> = Api::all(sa.client.clone());
    let node = &spoke.nodes[0];
    match nodes.delete(node, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => bail!("agent SA deleting node {node}: expected 403 Forbidden, got {other:?}"),
    }
}

/// manifests/hub/roles.yaml aggregates into the built-in `view`, `edit` and `admin`: a person bound
/// to `view` in a team's namespace reads its Federations (their SuperLink endpoints) and
/// Placements but changes nothing, and reads no ManagedCluster, Secret or pod port-forward; `edit`
/// changes Federations and Placements there, `admin` deletes them by collection; no one writes
/// their status. The roles bound directly grant the same without the rest of `view`.
async fn roles_for_people(cp: &ControlPlane) -> Result<()> {
    let hub = cp.cluster("hub")?;
    e2e::apply_file(&hub.client, &manifest("hub/roles.yaml"), "default").await?;
    let people = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-roles}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: scientist, namespace: team-roles}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: engineer, namespace: team-roles}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: owner, namespace: team-roles}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: team-roles}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: scientist-view, namespace: team-roles}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: scientist, namespace: team-roles}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: engineer-edit, namespace: team-roles}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: ServiceAccount, name: engineer, namespace: team-roles}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: owner-admin, namespace: team-roles}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{kind: ServiceAccount, name: owner, namespace: team-roles}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader-federations, namespace: team-roles}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flower-addon-federation-viewer}
subjects: [{kind: ServiceAccount, name: reader, namespace: team-roles}]
"#;
    e2e::apply_yaml(&hub.client, people, "team-roles").await?;
    let ns = Some("team-roles");
    let other = Some("team-other");
    let g = "flower-addon.io";
    let sa = |name: &'static str| e2e::service_account_token(hub, "team-roles", name, 600);
    let (scientist, engineer, owner, reader) =
        tokio::try_join!(sa("scientist"), sa("engineer"), sa("owner"), sa("reader"))?;
    // The clusterrole-aggregation controller folds the rules into view/edit/admin shortly after.
    let took = e2e::wait_until(
        "flower-addon roles aggregated into view, edit and admin",
        Duration::from_secs(60),
        || async {
            Ok(
                can_i(&hub.client, &scientist, &a("get", g, "federations", ns)).await?
                    && can_i(&hub.client, &engineer, &a("create", g, "placements", ns)).await?
                    && can_i(
                        &hub.client,
                        &owner,
                        &a("deletecollection", g, "federations", ns),
                    )
                    .await?,
            )
        },
    )
    .await?;
    eprintln!("  aggregated in {:.1}s", took.as_secs_f64());
    let mut portforward = a("create", "", "pods", ns);
    portforward.subresource = Some("portforward");
    let status = |verb| {
        let mut s = a(verb, g, "federations", ns);
        s.subresource = Some("status");
        s
    };
    check(
        hub,
        &scientist,
        &[
            (true, a("get", g, "federations", ns)),
            (true, a("watch", g, "federations", ns)),
            (true, status("get")),
            (true, a("list", g, "placements", ns)),
            (true, a("list", g, "placementdecisions", ns)),
            (false, a("get", g, "federations", other)),
            (false, a("create", g, "federations", ns)),
            (false, a("patch", g, "placements", ns)),
            (false, a("list", g, "managedclusters", None)),
            (false, a("get", "", "secrets", ns)),
            (false, portforward),
            (false, status("patch")),
            (true, a("get", g, "flowerruns", ns)),
            (false, a("create", g, "flowerruns", ns)),
            (false, a("get", g, "flowerruns", other)),
        ],
    )
    .await?;
    // A FlowerRun is code run on the namespace's Federations: `edit` there may create one (and
    // its FAB's ConfigMap), nowhere else, and never writes its status.
    let mut run_status = a("patch", g, "flowerruns", ns);
    run_status.subresource = Some("status");
    check(
        hub,
        &engineer,
        &[
            (true, a("create", g, "flowerruns", ns)),
            (true, a("create", "", "configmaps", ns)),
            (true, a("delete", g, "flowerruns", ns)),
            (false, a("create", g, "flowerruns", other)),
            (false, a("create", "", "configmaps", other)),
            (false, run_status),
        ],
    )
    .await?;
    check(
        hub,
        &engineer,
        &[
            (true, a("create", g, "federations", ns)),
            (true, a("patch", g, "federations", ns)),
            (true, a("delete", g, "placements", ns)),
            (false, a("deletecollection", g, "federations", ns)),
            (false, a("create", g, "placementdecisions", ns)),
            (false, status("update")),
            (false, a("list", g, "managedclusters", None)),
        ],
    )
    .await?;
    check(
        hub,
        &owner,
        &[
            (true, a("deletecollection", g, "federations", ns)),
            (true, a("deletecollection", g, "placements", ns)),
            (false, status("patch")),
            (false, a("update", g, "placementdecisions", ns)),
            (false, a("delete", g, "managedclusters", None)),
        ],
    )
    .await?;
    check(
        hub,
        &reader,
        &[
            (true, a("list", g, "federations", ns)),
            (false, a("list", g, "placements", ns)),
            (false, a("list", "", "configmaps", ns)),
            (false, a("create", g, "federations", ns)),
        ],
    )
    .await
}

/// Every document of manifests/hub and manifests/agent passes the real apiserver's validation and
/// admission (server-side dry run after the namespaces exist).
async fn manifests_accepted_dry_run(cp: &ControlPlane) -> Result<()> {
    for (cluster, dir) in [("hub", "hub"), ("spoke-2", "agent")] {
        let c = cp.cluster(cluster)?;
        apply_namespace(c, &format!("{dir}/namespace.yaml")).await?;
        let mut files: Vec<_> = std::fs::read_dir(manifest(dir))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        files.sort();
        ensure!(!files.is_empty(), "no manifests in manifests/{dir}");
        for f in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "yaml"))
        {
            let objs = e2e::apply_file_with(
                &c.client,
                f,
                "default",
                ApplyOptions {
                    kinds: None,
                    dry_run: true,
                },
            )
            .await?;
            ensure!(!objs.is_empty(), "{} holds no object", f.display());
            eprintln!("  {} accepted ({} objects)", f.display(), objs.len());
        }
    }
    Ok(())
}

async fn apply_namespace(c: &Cluster, rel: &str) -> Result<()> {
    e2e::apply_file(&c.client, &manifest(rel), "default").await?;
    Ok(())
}

/// Tenancy (manifests/hub/clusterset-binding-policy.yaml): a namespace admin may create
/// ManagedClusterSetBindings by RBAC, but the apiserver's ValidatingAdmissionPolicy refuses one
/// for a set the admin holds no `create` on `managedclustersets/bind` for, naming the user, the
/// set and the fix; once the platform admin grants bind on that set (by name), the binding is
/// accepted, and a binding to another set is still refused. An editor may not create bindings
/// at all; a binding not named after its set is refused by the CRD's rule.
async fn binding_a_cluster_set_needs_bind(cp: &ControlPlane) -> Result<()> {
    let hub = cp.cluster("hub")?;
    e2e::install_crds(&hub.client).await?;
    e2e::apply_file(&hub.client, &manifest("hub/roles.yaml"), "default").await?;
    e2e::apply_file(
        &hub.client,
        &manifest("hub/clusterset-binding-policy.yaml"),
        "default",
    )
    .await?;
    let setup = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-bind}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: lead, namespace: team-bind}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: dev, namespace: team-bind}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: lead-admin, namespace: team-bind}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{kind: ServiceAccount, name: lead, namespace: team-bind}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: dev-edit, namespace: team-bind}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: ServiceAccount, name: dev, namespace: team-bind}]
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata: {name: team-sites}
spec: {clusterSelector: {selectorType: ExclusiveClusterSetLabel}}
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata: {name: other-sites}
spec: {clusterSelector: {selectorType: ExclusiveClusterSetLabel}}
"#;
    e2e::apply_yaml(&hub.client, setup, "team-bind").await?;
    let lead = e2e::service_account_token(hub, "team-bind", "lead", 600).await?;
    let dev = e2e::service_account_token(hub, "team-bind", "dev", 600).await?;
    let g = "flower-addon.io";
    let ns = Some("team-bind");
    // RBAC: the admin may create bindings (aggregated into `admin`), the editor may not.
    e2e::wait_until(
        "bindings aggregated into admin",
        Duration::from_secs(60),
        || async {
            can_i(
                &hub.client,
                &lead,
                &a("create", g, "managedclustersetbindings", ns),
            )
            .await
        },
    )
    .await?;
    check(
        hub,
        &dev,
        &[
            (true, a("list", g, "managedclustersetbindings", ns)),
            (false, a("create", g, "managedclustersetbindings", ns)),
        ],
    )
    .await?;
    let bindings: Api<flower_addon_crds::ManagedClusterSetBinding> =
        Api::namespaced(lead.client.clone(), "team-bind");
    let binding = |set: &str| -> Result<flower_addon_crds::ManagedClusterSetBinding> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "flower-addon.io/v1alpha1",
            "kind": "ManagedClusterSetBinding",
            "metadata": {"name": set, "namespace": "team-bind"},
            "spec": {"clusterSet": set},
        }))?)
    };
    let refused = |res: std::result::Result<_, kube::Error>, set: &str| -> Result<()> {
        match res {
            Err(kube::Error::Api(s))
                if s.code == 403
                    && s.message
                        .contains(&format!("may not bind ManagedClusterSet {set}"))
                    && s.message.contains("managedclustersets/bind") =>
            {
                Ok(())
            }
            other => {
                bail!("binding {set} without bind: expected 403 from the policy, got {other:?}")
            }
        }
    };
    // The policy takes effect once the apiserver has loaded it: probe with dry runs (admission
    // runs, nothing is stored).
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let took = e2e::wait_until(
        "the ValidatingAdmissionPolicy refuses an unauthorised binding",
        Duration::from_secs(60),
        || async {
            Ok(bindings
                .create(&dry, &binding("team-sites")?)
                .await
                .is_err())
        },
    )
    .await?;
    eprintln!("  policy active in {:.1}s", took.as_secs_f64());
    refused(
        bindings
            .create(&PostParams::default(), &binding("team-sites")?)
            .await,
        "team-sites",
    )?;
    // The platform admin grants bind on team-sites only.
    let grant = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bind-team-sites}
rules:
  - apiGroups: [flower-addon.io]
    resources: [managedclustersets/bind]
    resourceNames: [team-sites]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: lead-binds-team-sites}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bind-team-sites}
subjects: [{kind: ServiceAccount, name: lead, namespace: team-bind}]
"#;
    e2e::apply_yaml(&hub.client, grant, "default").await?;
    e2e::wait_until(
        "the bound set is accepted",
        Duration::from_secs(30),
        || async {
            Ok(bindings
                .create(&PostParams::default(), &binding("team-sites")?)
                .await
                .is_ok())
        },
    )
    .await?;
    refused(
        bindings
            .create(&PostParams::default(), &binding("other-sites")?)
            .await,
        "other-sites",
    )?;
    // A binding not named after its set: the CRD's rule (before any policy).
    let mut misnamed = binding("team-sites")?;
    misnamed.metadata.name = Some("nickname".into());
    match bindings.create(&PostParams::default(), &misnamed).await {
        Err(kube::Error::Api(s))
            if s.code == 422
                && s.message
                    .contains("metadata.name must equal spec.clusterSet") => {}
        other => bail!("a misnamed binding: expected 422, got {other:?}"),
    }
    Ok(())
}
