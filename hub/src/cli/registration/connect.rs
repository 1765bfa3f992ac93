//! `flower-hub connect FEDERATION`: the `flwr` connection entry for a Federation's SuperLink —
//! its Control endpoint and the CA that signed its certificate, written to a file — printed, or
//! merged into `FLWR_HOME/config.toml` so `flwr run APP FEDERATION` works.
//!
//! Where the Control endpoint is:
//! - Kubernetes, by default: nowhere outside the hub cluster (the port SuperNodes reach serves
//!   the Fleet API only). `connect` listens on `127.0.0.1:<--local-port>` and forwards each
//!   connection to the SuperLink pod through the Kubernetes API (a port-forward: RBAC on
//!   `pods/portforward` decides who may run code on the Federation), until Ctrl-C;
//! - Kubernetes with `spec.superlink.service.exposeControl`: `status.endpoints.control`;
//! - standalone: the address in `status.json` (loopback unless `exposeControl`).
use super::*;

/// `flower-hub connect`.
#[derive(clap::Args, Debug)]
pub struct ConnectArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// The Federation's name (also the connection's name in `flwr`).
    pub federation: String,
    /// The Federation's namespace.
    #[arg(long = "federation-namespace", default_value = "default")]
    pub federation_namespace: String,
    /// Where to write the SuperLink's CA certificate (default `./<federation>-ca.crt`).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Merge the entry into `DIR/config.toml` (a `FLWR_HOME`; made when missing; the first
    /// connection written becomes `[superlink] default`) instead of only printing it.
    #[arg(long, conflicts_with = "app")]
    pub flwr_home: Option<PathBuf>,
    /// Flower ≤ 1.25 (connections live in the app): merge the entry into
    /// `[tool.flwr.federations.<federation>]` of `DIR/pyproject.toml`, keeping the rest of the
    /// file (comments too), instead of only printing it.
    #[arg(long, value_name = "DIR")]
    pub app: Option<PathBuf>,
    /// Kubernetes, Control API not exposed: the local port to forward from (`0`: any free
    /// port; the entry written names the port chosen).
    #[arg(long, default_value_t = 0)]
    pub local_port: u16,
}

/// What `flwr` needs to reach one SuperLink.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Connection {
    address: String,
    /// PEM of the CA; `None` for an insecure Federation.
    ca_pem: Option<String>,
    /// A port-forward to keep running: `(pod, container port)` in the Federation's namespace.
    forward: Option<(String, u16)>,
}

/// `flower-hub connect`.
pub fn connect(args: ConnectArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let hub = Hub::open(&args.hub_args).await?;
        let (ns, name) = (&args.federation_namespace, &args.federation);
        let mut listener = None;
        let connection = match &hub {
            Hub::File { dir, .. } => standalone_connection(dir, ns, name)?,
            Hub::Kube { client, .. } => {
                let mut connection = kube_connection(client, ns, name).await?;
                if connection.forward.is_some() {
                    let bound = tokio::net::TcpListener::bind(("127.0.0.1", args.local_port))
                        .await
                        .with_context(|| {
                            format!(
                                "--local-port {}: cannot listen on 127.0.0.1",
                                args.local_port
                            )
                        })?;
                    connection.address = bound.local_addr()?.to_string();
                    listener = Some(bound);
                }
                connection
            }
        };
        let ca_file = match &connection.ca_pem {
            Some(pem) => {
                let path = args
                    .ca_file
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(format!("{name}-ca.crt")));
                std::fs::write(&path, pem)
                    .with_context(|| format!("write the CA to {}", path.display()))?;
                Some(std::path::absolute(&path)?)
            }
            None => None,
        };
        let entry = entry_table(&connection.address, ca_file.as_deref());
        if let Some(app) = &args.app {
            let file = app.join("pyproject.toml");
            let current = std::fs::read_to_string(&file).with_context(|| {
                format!(
                    "read {} (--app names a Flower app directory, the one `flwr run` takes)",
                    file.display()
                )
            })?;
            let merged = merge_pyproject(&current, name, &entry)
                .with_context(|| format!("{} is not valid TOML", file.display()))?;
            std::fs::write(&file, merged).with_context(|| format!("write {}", file.display()))?;
            println!("wrote [tool.flwr.federations.{name}] to {}", file.display());
            println!("run: flwr run {} {name}", app.display());
        } else {
            match &args.flwr_home {
                Some(home) => {
                    let file = home.join("config.toml");
                    let current = match std::fs::read_to_string(&file) {
                        Ok(text) => text,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                        Err(e) => return Err(e).context(format!("read {}", file.display())),
                    };
                    let merged = merge_config(&current, name, entry)
                        .with_context(|| format!("{} is not valid TOML", file.display()))?;
                    std::fs::create_dir_all(home)?;
                    std::fs::write(&file, merged)
                        .with_context(|| format!("write {}", file.display()))?;
                    println!("wrote [superlink.{name}] to {}", file.display());
                    println!("FLWR_HOME={}", home.display());
                    println!("run: FLWR_HOME={} flwr run APP_DIR {name}", home.display());
                }
                None => {
                    let mut doc = toml::Table::new();
                    let mut superlink = toml::Table::new();
                    superlink.insert(name.clone(), toml::Value::Table(entry));
                    doc.insert("superlink".into(), toml::Value::Table(superlink));
                    println!(
                        "# flwr >= 1.26: add to $FLWR_HOME/config.toml (or pass --flwr-home DIR);\n\
                         # flwr <= 1.25: put the same keys under [tool.flwr.federations.{name}] in the app's pyproject.toml"
                    );
                    print!("{}", toml::to_string(&doc)?);
                }
            }
        }
        if let (Hub::Kube { client, .. }, Some(listener), Some((pod, port))) =
            (&hub, listener, &connection.forward)
        {
            println!(
                "forwarding {} to pod {ns}/{pod} port {port} through the Kubernetes API; keep this running while you use flwr (Ctrl-C stops it)",
                connection.address
            );
            use std::io::Write as _;
            std::io::stdout().flush()?;
            forward_until_signal(client, ns, pod, *port, listener).await?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Forwards every connection accepted on `listener` to `port` of pod `ns/pod` (one Kubernetes
/// port-forward stream each) until SIGINT/SIGTERM.
async fn forward_until_signal(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    port: u16,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<()> {
    let signal = crate::cli::serve::shutdown_signal();
    tokio::pin!(signal);
    loop {
        let (mut tcp, peer) = tokio::select! {
            () = &mut signal => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        let (client, ns, pod) = (client.clone(), ns.to_owned(), pod.to_owned());
        tokio::spawn(async move {
            let forwarded = async {
                let mut stream = crate::kube::portforward::open(&client, &ns, &pod, port).await?;
                tokio::io::copy_bidirectional(&mut tcp, &mut stream).await?;
                anyhow::Ok(())
            };
            if let Err(e) = forwarded.await {
                eprintln!("flower-hub: port-forward for {peer} to pod {pod} port {port}: {e:#}");
            }
        });
    }
}

fn entry_table(address: &str, ca_file: Option<&Path>) -> toml::Table {
    let mut entry = toml::Table::new();
    entry.insert("address".into(), toml::Value::String(address.to_owned()));
    match ca_file {
        Some(path) => entry.insert(
            "root-certificates".into(),
            toml::Value::String(path.display().to_string()),
        ),
        None => entry.insert("insecure".into(), toml::Value::Boolean(true)),
    };
    entry
}

/// `current` (an app's `pyproject.toml`, Flower ≤ 1.25) with `[tool.flwr.federations.<name>]`
/// set to `entry`; every other key, table and comment kept as written.
fn merge_pyproject(current: &str, name: &str, entry: &toml::Table) -> anyhow::Result<String> {
    let mut doc: toml_edit::DocumentMut = current.parse()?;
    let mut table = toml_edit::Table::new();
    for (key, value) in entry {
        let value = match value {
            toml::Value::String(s) => toml_edit::value(s.as_str()),
            toml::Value::Boolean(b) => toml_edit::value(*b),
            other => anyhow::bail!("unexpected connection value {other}"),
        };
        table.insert(key, value);
    }
    let mut parent = doc.as_table_mut();
    for key in ["tool", "flwr", "federations"] {
        let item = parent.entry(key).or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        });
        parent = item
            .as_table_mut()
            .with_context(|| format!("`{key}` is not a table"))?;
    }
    parent.insert(name, toml_edit::Item::Table(table));
    Ok(doc.to_string())
}

/// `current` (a `config.toml`) with `[superlink.<name>]` set to `entry`, other connections and
/// keys kept, and `[superlink] default = name` when no default was set.
fn merge_config(current: &str, name: &str, entry: toml::Table) -> anyhow::Result<String> {
    let mut doc: toml::Table = toml::from_str(current)?;
    let superlink = doc
        .entry("superlink")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(superlink) = superlink.as_table_mut() else {
        anyhow::bail!("`superlink` is not a table");
    };
    superlink
        .entry("default")
        .or_insert_with(|| toml::Value::String(name.to_owned()));
    superlink.insert(name.to_owned(), toml::Value::Table(entry));
    Ok(toml::to_string(&doc)?)
}

fn standalone_connection(dir: &Path, ns: &str, name: &str) -> anyhow::Result<Connection> {
    let status = crate::standalone::status::HubStatus::read(dir).with_context(|| {
        format!(
            "no status.json in {}: is `flower-hub serve --standalone` running?",
            dir.display()
        )
    })?;
    let Some(fed) = status
        .federations
        .iter()
        .find(|f| f.namespace == ns && f.name == name)
    else {
        anyhow::bail!(
            "no Federation {ns}/{name} in the standalone hub's status (see `flower-hub status`; \
             --federation-namespace sets the namespace)"
        );
    };
    let address = fed.control.clone().with_context(|| {
        format!("Federation {ns}/{name} has no Control address yet (its SuperLink is not set up)")
    })?;
    let ca_path = crate::standalone::superlink::SuperLinkPaths::new(dir, ns, name).ca;
    let ca_pem = match std::fs::read_to_string(&ca_path) {
        Ok(pem) => Some(pem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None, // insecure: no TLS files
        Err(e) => return Err(e).context(format!("read {}", ca_path.display())),
    };
    Ok(Connection {
        address,
        ca_pem,
        forward: None,
    })
}

async fn kube_connection(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<Connection> {
    let fed = kube::Api::<flower_addon_crds::Federation>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .with_context(|| format!("get Federation {ns}/{name}"))?
        .with_context(|| {
            format!("no Federation {ns}/{name} (--federation-namespace sets the namespace)")
        })?;
    let (address, forward) = if crate::core::superlink::separate_control(&fed) {
        let (_, dialect) = crate::core::render::federation_dialect(&fed)?;
        let port = crate::core::superlink::SuperLinkPorts::container(&fed, dialect).control;
        let pod = format!("{}-0", crate::core::render::superlink_name(name));
        // The address is the local end of the port-forward, known once it listens.
        (String::new(), Some((pod, port)))
    } else {
        let address = fed
            .status
            .as_ref()
            .and_then(|s| s.endpoints.as_ref())
            .and_then(|e| e.control.clone())
            .with_context(|| {
                format!(
                    "Federation {ns}/{name} has no external Control endpoint yet (status.endpoints.control): \
                     spec.superlink.service.exposeControl is set, so it comes from its NodePort or \
                     LoadBalancer Service (spec.superlink.service.type) or spec.superlink.externalAddress"
                )
            })?;
        (address, None)
    };
    let ca_pem = if fed.spec.insecure {
        None
    } else {
        let secret = crate::core::render::superlink_tls_secret_name(&fed);
        let data = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
            .get(&secret)
            .await
            .with_context(|| format!("get the SuperLink's TLS Secret {ns}/{secret}"))?
            .data
            .unwrap_or_default();
        let ca = data
            .get("ca.crt")
            .with_context(|| format!("Secret {ns}/{secret} has no ca.crt"))?;
        Some(String::from_utf8(ca.0.clone()).context("ca.crt is not text")?)
    };
    Ok(Connection {
        address,
        ca_pem,
        forward,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_is_merged_into_an_existing_config() {
        let current = "[superlink]\ndefault = \"other\"\n\n[superlink.other]\naddress = \"o:1\"\ninsecure = true\n";
        let merged = merge_config(
            current,
            "fed",
            entry_table("hub.example:30093", Some(Path::new("/x/ca.crt"))),
        )
        .unwrap();
        let doc: toml::Table = toml::from_str(&merged).unwrap();
        let sl = doc["superlink"].as_table().unwrap();
        assert_eq!(sl["default"].as_str(), Some("other"), "the default is kept");
        assert_eq!(sl["other"]["address"].as_str(), Some("o:1"));
        assert_eq!(sl["fed"]["address"].as_str(), Some("hub.example:30093"));
        assert_eq!(sl["fed"]["root-certificates"].as_str(), Some("/x/ca.crt"));
        assert!(sl["fed"].get("insecure").is_none());
        // A fresh FLWR_HOME gets this connection as its default; insecure has no CA.
        let fresh = merge_config("", "open", entry_table("h:1", None)).unwrap();
        let doc: toml::Table = toml::from_str(&fresh).unwrap();
        assert_eq!(doc["superlink"]["default"].as_str(), Some("open"));
        assert_eq!(doc["superlink"]["open"]["insecure"].as_bool(), Some(true));
        assert!(merge_config("not toml [", "x", toml::Table::new()).is_err());
    }

    #[test]
    fn flower_1_25_apps_get_the_entry_in_their_pyproject_with_the_rest_kept() {
        let current = "# my app\n[project]\nname = \"app\" # keep me\n\n[tool.flwr.app.config]\nnum-server-rounds = 3\n\n[tool.flwr.federations]\ndefault = \"local\"\n\n[tool.flwr.federations.local]\noptions.num-supernodes = 2\n";
        let entry = entry_table("hub.example:30093", Some(Path::new("/x/ca.crt")));
        let merged = merge_pyproject(current, "fed", &entry).unwrap();
        assert!(merged.starts_with("# my app\n"), "{merged}");
        assert!(merged.contains("name = \"app\" # keep me"), "{merged}");
        let doc: toml::Table = toml::from_str(&merged).unwrap();
        let feds = doc["tool"]["flwr"]["federations"].as_table().unwrap();
        assert_eq!(
            feds["default"].as_str(),
            Some("local"),
            "the default is kept"
        );
        assert_eq!(
            feds["local"]["options"]["num-supernodes"].as_integer(),
            Some(2)
        );
        assert_eq!(feds["fed"]["address"].as_str(), Some("hub.example:30093"));
        assert_eq!(feds["fed"]["root-certificates"].as_str(), Some("/x/ca.crt"));
        // Written again: replaced, not duplicated; an app without the tables gets them.
        let again = merge_pyproject(&merged, "fed", &entry_table("h:2", None)).unwrap();
        let doc: toml::Table = toml::from_str(&again).unwrap();
        assert_eq!(
            doc["tool"]["flwr"]["federations"]["fed"]["address"].as_str(),
            Some("h:2")
        );
        assert_eq!(
            doc["tool"]["flwr"]["federations"]["fed"]["insecure"].as_bool(),
            Some(true)
        );
        let bare = merge_pyproject("[project]\nname = \"a\"\n", "fed", &entry).unwrap();
        let doc: toml::Table = toml::from_str(&bare).unwrap();
        assert_eq!(
            doc["tool"]["flwr"]["federations"]["fed"]["address"].as_str(),
            Some("hub.example:30093")
        );
        assert!(merge_pyproject("tool = 1\n", "fed", &entry).is_err());
    }
}
