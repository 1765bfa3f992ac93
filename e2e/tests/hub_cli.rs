//! `flower-hub token|accept|revoke|status` in Kubernetes mode, as an admin runs them: the real
//! binary (`target/debug/flower-hub`) with KUBECONFIG set to a real hub apiserver's admin
//! kubeconfig. Tokens become Secrets, the CA Secret is created on first use, the hub address is
//! derived from the NodePort Service `flower-hub` and a kwok node's InternalIP, `-o secret`
//! prints an agent bootstrap Secret the apiserver accepts, and accept/revoke flip
//! `spec.hubAcceptsClient` of ManagedClusters.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use e2e::{Cluster, ControlPlane};
use flower_addon_crds::{Federation, ManagedCluster, ManagedClusterSpec};
use flower_addon_hub::kube::store::{
    CA_SECRET, HUB_SERVICE, KubeStore, TOKEN_SECRET_PREFIX, TOKEN_SECRET_TYPE,
};
use flower_addon_hub::registration::ca::HubCa;
use flower_addon_hub::registration::store::ClusterStore;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

const HUB_NS: &str = "flower-addon-system";
const USER: &str = "e2e-admin";

/// The real `flower-hub` binary with a kubeconfig and nothing from the caller's environment that
/// would select another hub.
struct HubCli {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

/// Exit status and output of one command.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl HubCli {
    async fn run(&self, args: &[&str]) -> Result<Run> {
        let out = tokio::process::Command::new(&self.bin)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("FLOWER_HUB_STATE_DIR")
            .env_remove("POD_NAMESPACE")
            // What a user gets: the CLI's own default log filter.
            .env_remove("RUST_LOG")
            .output()
            .await
            .with_context(|| format!("run {} {args:?}", self.bin.display()))?;
        Ok(Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Runs a command that must succeed; returns its stdout.
    async fn ok(&self, args: &[&str]) -> Result<String> {
        let run = self.run(args).await?;
        ensure!(
            run.ok,
            "flower-hub {args:?} failed:\n{}\n{}",
            run.stdout,
            run.stderr
        );
        Ok(run.stdout)
    }

    /// Runs a command that must fail; returns its stderr.
    async fn fails(&self, args: &[&str]) -> Result<String> {
        let run = self.run(args).await?;
        ensure!(
            !run.ok,
            "flower-hub {args:?} must fail but succeeded:\n{}",
            run.stdout
        );
        Ok(run.stderr)
    }
}

/// The hub cluster as the CLI sees it: CRDs, namespace and NodePort Service from
/// `manifests/hub`, kwok nodes with InternalIPs, and the address the CLI must derive.
struct HubUnderTest {
    client: Client,
    cli: HubCli,
    server_name: String,
    expected_hub: String,
}

impl HubUnderTest {
    async fn new(hub: &Cluster) -> Result<Self> {
        let client = hub.client.clone();
        e2e::install_crds(&hub.client).await?;
        let manifests = e2e::repo_root().join("manifests/hub");
        e2e::apply_file(&client, &manifests.join("namespace.yaml"), "default").await?;
        e2e::apply_file(&client, &manifests.join("service.yaml"), HUB_NS).await?;
        let cli = HubCli {
            bin: e2e::binary("flower-hub")?,
            kubeconfig: hub.kubeconfig.clone(),
        };
        give_nodes_internal_ips(&client).await?;
        let expected_hub = expected_hub_address(&client).await?;
        ensure!(expected_hub.starts_with("10.99.0.1:"), "{expected_hub}");
        Ok(Self {
            client,
            cli,
            server_name: format!("{HUB_SERVICE}.{HUB_NS}.svc"),
            expected_hub,
        })
    }
}

/// `InternalIP:nodePort` the CLI must derive: the first node by name with an InternalIP.
async fn expected_hub_address(client: &Client) -> Result<String> {
    let svc = Api::<Service>::namespaced(client.clone(), HUB_NS)
        .get(HUB_SERVICE)
        .await?;
    let node_port = svc
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.into_iter().find(|p| p.name.as_deref() == Some("channel")))
        .and_then(|p| p.node_port)
        .context("the NodePort Service has no node port")?;
    let mut nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    nodes.sort_by_key(|n| n.name_any());
    let ip = nodes
        .iter()
        .find_map(|n| {
            n.status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .find(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
        })
        .context("no kwok node reports an InternalIP")?;
    Ok(format!("{ip}:{node_port}"))
}

/// Gives every node an InternalIP, as kubelets report on real nodes: the harness's kwok has no
/// node IP configured, and its stages keep addresses that are already set.
async fn give_nodes_internal_ips(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    names.sort();
    for (i, name) in names.iter().enumerate() {
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"addresses": [
                    {"type": "InternalIP", "address": format!("10.99.0.{}", i + 1)},
                    {"type": "Hostname", "address": name},
                ]}})),
            )
            .await
            .with_context(|| format!("set the InternalIP of node {name}"))?;
    }
    e2e::wait_until(
        "nodes keep their InternalIP",
        Duration::from_secs(30),
        || async { Ok(expected_hub_address(client).await.is_ok()) },
    )
    .await?;
    Ok(())
}

async fn token_secret_names(client: &Client) -> Result<BTreeSet<String>> {
    Ok(Api::<Secret>::namespaced(client.clone(), HUB_NS)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|s| s.type_.as_deref() == Some(TOKEN_SECRET_TYPE))
        .map(|s| s.name_any())
        .collect())
}

async fn accepted(client: &Client, name: &str) -> Result<bool> {
    Ok(Api::<ManagedCluster>::all(client.clone())
        .get(name)
        .await?
        .spec
        .hub_accepts_client)
}

fn kubeconfig_with_dead_server(hub: &Cluster, dir: &Path) -> Result<PathBuf> {
    let path = dir.join("dead.kubeconfig");
    e2e::kubeconfig::write(
        &path,
        "gone",
        &format!("https://127.0.0.1:{}", e2e::free_port()?),
        &hub.ca_file,
        "admin",
        &hub.admin_token,
    )?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread")]
async fn token_accept_revoke_and_status_work_on_the_hub_cluster_api() -> Result<()> {
    e2e::binary("flower-hub")?;
    e2e::install_crypto();
    let cp = ControlPlane::start(&["hub"])
        .await
        .context("control plane (run e2e/k8s/build.sh if binaries are missing)")?;
    let hub = cp.cluster("hub")?;
    let h = HubUnderTest::new(hub).await?;
    let (token_id, ca) = token_create_json_makes_the_ca_and_a_token(&h).await?;
    let secret_token_id = token_create_secret_prints_a_bootstrap_secret(&h, &ca).await?;
    token_list_and_delete(&h, &token_id, &secret_token_id).await?;
    accept_and_revoke(&h).await?;
    status_shows_federations(&h).await?;

    // 6. revoke --delete removes the ManagedCluster.
    let out = h.cli.ok(&["revoke", "spoke-1", "--delete"]).await?;
    ensure!(out.contains("cluster spoke-1 deleted"), "{out}");
    let clusters: Api<ManagedCluster> = Api::all(h.client.clone());
    ensure!(clusters.get_opt("spoke-1").await?.is_none());

    flower_ca_rotation_steps_edit_the_ca_secret(&h).await?;
    unreachable_api_and_mixed_modes_are_refused(&h, hub, cp.work_dir()).await
}

/// 7. `flower-hub ca` on the hub cluster's API. Before the hub made the Flower CA
///    there is nothing to rotate; then stage → promote → retire edit its Secret (next CA beside
///    the current one; the next one signing and the old one still trusted; the old one gone),
///    and a step out of order is refused naming the step to take.
async fn flower_ca_rotation_steps_edit_the_ca_secret(h: &HubUnderTest) -> Result<()> {
    use flower_addon_hub::kube::store::FLOWER_CA_SECRET;
    let cli = &h.cli;
    let stderr = cli.fails(&["ca", "status"]).await?;
    ensure!(stderr.contains("no Flower CA yet"), "{stderr}");
    // What `serve` does on its first start.
    let first = flower_addon_hub::cli::serve::load_or_create_ca_secret_for(
        h.client.clone(),
        HUB_NS,
        flower_addon_hub::registration::ca::CaRole::Flower,
    )
    .await?;
    let data = |secret: &Secret, key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), HUB_NS);
    let stderr = cli.fails(&["ca", "rotate", "promote"]).await?;
    ensure!(stderr.contains("`stage` a next CA first"), "{stderr}");

    let out = cli.ok(&["ca", "rotate", "stage"]).await?;
    ensure!(
        out.contains("rollout restart deployment flower-hub") && out.contains("rotation:   staged"),
        "{out}"
    );
    let staged = secrets.get(FLOWER_CA_SECRET).await?;
    ensure!(data(&staged, "ca.crt").as_deref() == Some(first.cert_pem()));
    let next = data(&staged, "next.crt").context("next.crt")?;
    ensure!(data(&staged, "next.key").is_some(), "next.key");
    let status = cli.ok(&["ca", "status"]).await?;
    let next_hash = flower_addon_agent::tls::bundle_hashes(&next)[0].clone();
    ensure!(
        status.contains(&format!("trusted:    {}, {next_hash}", first.hash())),
        "{status}"
    );

    // Promote waits for the hub to start with the staged CA (`serve` records the CA it
    // loaded); a back-to-back step is refused, naming the restart and --force.
    let stderr = cli.fails(&["ca", "rotate", "promote"]).await?;
    ensure!(
        stderr.contains("has not reached the hub yet")
            && stderr.contains("rollout restart deployment flower-hub")
            && stderr.contains("--force"),
        "{stderr}"
    );
    // What `serve` records when it starts: the CA material it loaded.
    let restarted = || async {
        let store =
            flower_addon_hub::kube::store::KubeStore::without_watch(h.client.clone(), HUB_NS);
        use flower_addon_hub::registration::ca::CaRole;
        use flower_addon_hub::registration::store::ClusterStore;
        let material = store
            .load_ca_for(CaRole::Flower)
            .await?
            .context("the Flower CA")?;
        store
            .mark_ca_in_force(
                CaRole::Flower,
                &flower_addon_hub::registration::rotation::in_force_fingerprint(&material),
            )
            .await?;
        anyhow::Ok(())
    };
    restarted().await?;
    let status = cli.ok(&["ca", "status"]).await?;
    ensure!(status.contains("in force:   yes"), "{status}");
    cli.ok(&["ca", "rotate", "promote"]).await?;
    let promoted = secrets.get(FLOWER_CA_SECRET).await?;
    ensure!(
        data(&promoted, "ca.crt") == Some(next.clone()),
        "the next CA signs"
    );
    ensure!(data(&promoted, "previous.crt").as_deref() == Some(first.cert_pem()));
    ensure!(data(&promoted, "next.crt").is_none());
    let stderr = cli.fails(&["ca", "rotate", "stage"]).await?;
    ensure!(
        stderr.contains("`retire` the replaced CA first"),
        "{stderr}"
    );

    // Retire right after promote is the mis-step that locked every agent out: refused, and
    // taken only with --force (with a warning).
    let stderr = cli.fails(&["ca", "rotate", "retire"]).await?;
    ensure!(stderr.contains("has not reached the hub yet"), "{stderr}");
    let status = cli.ok(&["ca", "status"]).await?;
    ensure!(status.contains("in force:   not yet"), "{status}");
    let forced = cli.run(&["ca", "rotate", "retire", "--force"]).await?;
    ensure!(
        forced.ok && forced.stderr.contains("warning: --force"),
        "{}\n{}",
        forced.stdout,
        forced.stderr
    );
    let retired = secrets.get(FLOWER_CA_SECRET).await?;
    ensure!(data(&retired, "ca.crt") == Some(next), "the new CA stays");
    ensure!(
        data(&retired, "previous.crt").is_none(),
        "the old CA is gone"
    );
    let status = cli.ok(&["ca", "status"]).await?;
    ensure!(
        status.contains("rotation:   idle") && status.contains(&format!("signing CA: {next_hash}")),
        "{status}"
    );
    Ok(())
}

/// 1. token create -o json before any hub ran: creates the CA Secret and the token Secret,
///    derives the address from the NodePort Service and a node's InternalIP. Returns the token
///    id and the CA.
async fn token_create_json_makes_the_ca_and_a_token(h: &HubUnderTest) -> Result<(String, HubCa)> {
    let HubUnderTest {
        client,
        cli,
        server_name,
        expected_hub,
    } = h;
    let out = cli
        .ok(&["token", "create", "--ttl", "1h", "-o", "json"])
        .await?;
    let json: serde_json::Value = serde_json::from_str(&out).context(out.clone())?;
    let field = |k: &str| json[k].as_str().map(str::to_owned);
    let token = field("token").context("token")?;
    let (token_id, _) = token.split_once('.').context("id.secret")?;
    let ca = HubCa::from_material(
        KubeStore::without_watch(client.clone(), HUB_NS)
            .load_ca()
            .await?
            .context("token create made the CA Secret")?,
    )?;
    ensure!(
        field("hub").as_deref() == Some(expected_hub.as_str()),
        "{out}"
    );
    ensure!(field("caHash").as_deref() == Some(ca.hash()), "{out}");
    ensure!(
        field("serverName").as_deref() == Some(server_name.as_str()),
        "{out}"
    );
    ensure!(field("expires").is_some_and(|e| e.ends_with('Z')), "{out}");
    let join = field("joinCommand").context("joinCommand")?;
    ensure!(
        join.contains(&format!("--hub {expected_hub} "))
            && join.contains(&format!("--server-name {server_name}")),
        "{join}"
    );
    // The token reaches the agent on standard input, never as an argument (`ps` shows those).
    ensure!(
        join.contains("| flower-agent join --token-file - ") && !join.contains("--token "),
        "{join}"
    );
    let secrets = token_secret_names(client).await?;
    ensure!(
        secrets == BTreeSet::from([format!("{TOKEN_SECRET_PREFIX}{token_id}")]),
        "{secrets:?}"
    );
    ensure!(
        Api::<Secret>::namespaced(client.clone(), HUB_NS)
            .get_opt(CA_SECRET)
            .await?
            .is_some()
    );
    Ok((token_id.to_owned(), ca))
}

/// 2. -o secret: a bootstrap Secret the apiserver accepts, with exactly the agent's keys.
///    Returns its token id.
async fn token_create_secret_prints_a_bootstrap_secret(
    h: &HubUnderTest,
    ca: &HubCa,
) -> Result<String> {
    let HubUnderTest {
        client,
        cli,
        server_name,
        expected_hub,
    } = h;
    let stderr = cli.fails(&["token", "create", "-o", "secret"]).await?;
    ensure!(stderr.contains("--cluster-name"), "{stderr}");
    ensure!(
        token_secret_names(client).await?.len() == 1,
        "a refused -o secret must not create a token"
    );
    let yaml = cli
        .ok(&[
            "token",
            "create",
            "-o",
            "secret",
            "--cluster-name",
            "spoke-1",
            "--label",
            "env=prod",
            "--label",
            "zone=a",
            "--claim",
            "region=eu",
        ])
        .await?;
    let secret: Secret = serde_saphyr::from_str(&yaml).context(yaml.clone())?;
    ensure!(secret.name_any() == "flower-agent-bootstrap", "{yaml}");
    ensure!(
        secret.metadata.namespace.as_deref() == Some("flower-addon-agent"),
        "{yaml}"
    );
    ensure!(secret.type_.as_deref() == Some("Opaque"), "{yaml}");
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.get("app.kubernetes.io/name").map(String::as_str) == Some("flower-agent")
            && labels.get("app.kubernetes.io/part-of").map(String::as_str) == Some("flower-addon"),
        "{yaml}"
    );
    let data = secret.string_data.clone().context("stringData")?;
    ensure!(
        data.keys().map(String::as_str).collect::<Vec<_>>()
            == [
                "caHash",
                "claims",
                "clusterName",
                "hub",
                "labels",
                "serverName",
                "token"
            ],
        "{yaml}"
    );
    ensure!(data["hub"] == *expected_hub, "{yaml}");
    ensure!(data["caHash"] == ca.hash(), "{yaml}");
    ensure!(data["serverName"] == *server_name, "{yaml}");
    ensure!(data["clusterName"] == "spoke-1", "{yaml}");
    ensure!(data["labels"] == "env=prod,zone=a", "{yaml}");
    ensure!(data["claims"] == "region=eu", "{yaml}");
    let (secret_token_id, _) = data["token"].split_once('.').context("id.secret")?;
    e2e::apply_yaml(
        client,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: flower-addon-agent\n",
        "default",
    )
    .await?;
    e2e::apply_yaml(client, &yaml, "flower-addon-agent").await?;
    let applied = Api::<Secret>::namespaced(client.clone(), "flower-addon-agent")
        .get("flower-agent-bootstrap")
        .await?;
    let stored = applied.data.unwrap_or_default();
    ensure!(
        stored.get("token").map(|b| b.0.as_slice()) == Some(data["token"].as_bytes()),
        "the applied Secret holds the token"
    );

    Ok(secret_token_id.to_owned())
}

/// 3. token list shows both; delete removes the Secret; a second delete fails.
async fn token_list_and_delete(
    h: &HubUnderTest,
    token_id: &str,
    secret_token_id: &str,
) -> Result<()> {
    let HubUnderTest { client, cli, .. } = h;
    let list = cli.ok(&["token", "list"]).await?;
    ensure!(
        list.contains(token_id) && list.contains(secret_token_id) && list.contains("valid"),
        "{list}"
    );
    let out = cli.ok(&["token", "delete", token_id]).await?;
    ensure!(out.contains(&format!("token {token_id} deleted")), "{out}");
    ensure!(
        token_secret_names(client).await?
            == BTreeSet::from([format!("{TOKEN_SECRET_PREFIX}{secret_token_id}")])
    );
    let stderr = cli.fails(&["token", "delete", token_id]).await?;
    ensure!(stderr.contains("no token"), "{stderr}");
    ensure!(!cli.ok(&["token", "list"]).await?.contains(token_id));

    Ok(())
}

/// 4. accept/revoke: an unknown cluster is a clear failure; a ManagedCluster the admin created
///    is accepted, listed and revoked.
async fn accept_and_revoke(h: &HubUnderTest) -> Result<()> {
    let HubUnderTest { client, cli, .. } = h;
    let stderr = cli.fails(&["accept", "spoke-9"]).await?;
    ensure!(
        stderr.contains("\"spoke-9\"") && stderr.contains("flower-hub status"),
        "{stderr}"
    );
    let stderr = cli.fails(&["revoke", "spoke-9"]).await?;
    ensure!(stderr.contains("\"spoke-9\""), "{stderr}");
    let clusters: Api<ManagedCluster> = Api::all(client.clone());
    clusters
        .create(
            &PostParams::default(),
            &ManagedCluster::new("spoke-1", ManagedClusterSpec::default()),
        )
        .await?;
    ensure!(!accepted(client, "spoke-1").await?);
    let out = cli.ok(&["accept", "spoke-1"]).await?;
    ensure!(out.contains("cluster spoke-1 accepted"), "{out}");
    ensure!(accepted(client, "spoke-1").await?);
    let status = cli.ok(&["status"]).await?;
    let row = status
        .lines()
        .find(|l| l.starts_with("spoke-1 "))
        .with_context(|| format!("spoke-1 in\n{status}"))?;
    ensure!(
        row.split_whitespace().take(3).collect::<Vec<_>>() == ["spoke-1", "true", "Unknown"],
        "{status}"
    );
    ensure!(status.contains("(no Federations)"), "{status}");
    cli.ok(&["revoke", "spoke-1"]).await?;
    ensure!(!accepted(client, "spoke-1").await?);

    Ok(())
}

/// 5. status shows Federations as read from the API, and JSON the same facts.
async fn status_shows_federations(h: &HubUnderTest) -> Result<()> {
    let HubUnderTest { client, cli, .. } = h;
    e2e::apply_yaml(
        client,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n",
        "default",
    )
    .await?;
    let fed = serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": "fed", "namespace": "team"},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": false,
            "placementRef": {"name": "everywhere"},
            // exposeControl: connect writes the external Control endpoint (the default,
            // a port-forward to the SuperLink pod, needs a real pod: real_node).
            "superlink": {"image": "flwr/superlink:1.42.0", "externalAddress": "hub.example:30092",
                          "service": {"exposeControl": true}},
            "supernodes": {"image": "flwr/supernode:1.42.0", "pools": [{"name": "p0", "replicas": 2, "images": {}}]},
        }
    });
    let feds: Api<Federation> = Api::namespaced(client.clone(), "team");
    feds.patch(
        "fed",
        &PatchParams::apply(USER).force(),
        &Patch::Apply(&fed),
    )
    .await
    .context("apply Federation")?;
    feds.patch_status(
        "fed",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "selectedClusters": 2,
            "supernodes": "3/4",
            "readySupernodes": 3,
            "desiredSupernodes": 4,
            "clusters": [{"name": "spoke-1", "supernodes": "2/2"}, {"name": "spoke-2", "supernodes": "1/2"}],
            "conditions": [{
                "type": "Ready", "status": "False", "reason": "SupernodesNotReady",
                "message": "3/4 SuperNodes ready", "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        }})),
    )
    .await
    .context("patch Federation status")?;
    let status = cli.ok(&["status"]).await?;
    let row = status
        .lines()
        .find(|l| l.starts_with("team "))
        .with_context(|| format!("team/fed in\n{status}"))?;
    ensure!(
        row.split_whitespace().take(7).collect::<Vec<_>>()
            == [
                "team",
                "fed",
                "StatefulSet",
                "subprocess",
                "2",
                "3/4",
                "False"
            ]
            && row.contains("3/4 SuperNodes ready"),
        "{status}"
    );
    let json: serde_json::Value = serde_json::from_str(&cli.ok(&["status", "-o", "json"]).await?)?;
    let f = &json["federations"][0];
    ensure!(
        f["namespace"] == "team"
            && f["name"] == "fed"
            && f["clusters"] == 2
            && f["supernodes"] == "3/4"
            && f["ready"] == "False"
            && f["selected"] == serde_json::json!(["spoke-1", "spoke-2"]),
        "{json:#}"
    );
    let c = &json["clusters"][0];
    ensure!(
        c["name"] == "spoke-1" && c["hubAcceptsClient"] == false,
        "{json:#}"
    );

    // connect: without an external Control endpoint it says what to do ...
    let stderr = cli
        .fails(&["connect", "fed", "--federation-namespace", "team"])
        .await?;
    ensure!(
        stderr.contains("status.endpoints.control") && stderr.contains("NodePort"),
        "{stderr}"
    );
    // ... with one, it writes the SuperLink's CA and the entry into FLWR_HOME/config.toml.
    feds.patch_status(
        "fed",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"endpoints": {
            "fleet": "hub.example:30092", "control": "hub.example:30093"}}})),
    )
    .await?;
    e2e::apply_yaml(
        client,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: fed-superlink-tls}\nstringData: {ca.crt: \"CA PEM\"}\n",
        "team",
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let (home, ca) = (dir.path().join("flwr"), dir.path().join("fed-ca.crt"));
    let (home_s, ca_s) = (home.display().to_string(), ca.display().to_string());
    let out = cli
        .ok(&[
            "connect",
            "fed",
            "--federation-namespace",
            "team",
            "--flwr-home",
            &home_s,
            "--ca-file",
            &ca_s,
        ])
        .await?;
    ensure!(out.contains(&format!("FLWR_HOME={home_s}")), "{out}");
    let config = std::fs::read_to_string(home.join("config.toml"))?;
    ensure!(
        config.contains("default = \"fed\"")
            && config.contains("address = \"hub.example:30093\"")
            && config.contains(&format!("root-certificates = \"{ca_s}\"")),
        "{config}"
    );
    ensure!(std::fs::read_to_string(&ca)? == "CA PEM", "CA file");
    Ok(())
}

/// 7. An unreachable API names the kubeconfig and suggests --state-dir; a standalone state dir
///    and a kubeconfig together are refused.
async fn unreachable_api_and_mixed_modes_are_refused(
    h: &HubUnderTest,
    hub: &Cluster,
    dir: &Path,
) -> Result<()> {
    let cli = &h.cli;
    let dead = kubeconfig_with_dead_server(hub, dir)?;
    let dead_path = dead.display().to_string();
    let stderr = cli.fails(&["status", "--kubeconfig", &dead_path]).await?;
    ensure!(
        stderr.contains("cannot reach the hub cluster's Kubernetes API")
            && stderr.contains(&dead_path)
            && stderr.contains("context gone")
            && stderr.contains("--state-dir"),
        "{stderr}"
    );
    ensure!(
        stderr.trim().lines().count() == 1 && !stderr.contains('\u{1b}'),
        "one plain error line, no client log noise or colour codes: {stderr:?}"
    );
    let stderr = cli
        .fails(&["token", "list", "--context", "no-such-context"])
        .await?;
    ensure!(
        stderr.contains("no-such-context") && stderr.contains("it has: hub"),
        "{stderr}"
    );
    let state = tempfile::tempdir()?;
    let stderr = cli
        .fails(&[
            "token",
            "list",
            "--state-dir",
            &state.path().display().to_string(),
            "--kubeconfig",
            &dead_path,
        ])
        .await?;
    ensure!(stderr.contains("--state-dir"), "{stderr}");
    Ok(())
}
