//! Federations, Placements, ManagedClusterSets, ManagedClusterSetBindings, FlowerRuns and the
//! ConfigMaps holding their apps, read from a directory of YAML files, re-read when a file
//! changes (the same files `kubectl apply -f` takes).
//!
//! An invalid file is reported (file, field path, message) and ignored, and it does not stop the
//! other files: the objects it held before keep their last valid version, so a typo never tears
//! a running federation down.
use flower_addon_crds::policy::PodPolicy;
use flower_addon_crds::{
    Federation, FlowerRun, ManagedClusterSet, ManagedClusterSetBinding, Placement,
    validate_cluster_set, validate_cluster_set_binding, validate_flower_run, validate_placement,
};
use k8s_openapi::api::core::v1::ConfigMap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

type Key = (String, String);

/// The valid objects of a manifests directory and the problems found in it.
pub struct Manifests {
    dir: PathBuf,
    policy: PodPolicy,
    fingerprint: Vec<(PathBuf, SystemTime, u64)>,
    /// Last valid objects of every file.
    by_file: BTreeMap<PathBuf, FileObjects>,
    problems: Vec<String>,
}

#[derive(Clone, Default)]
struct FileObjects {
    federations: Vec<Federation>,
    placements: Vec<Placement>,
    cluster_sets: Vec<ManagedClusterSet>,
    bindings: Vec<ManagedClusterSetBinding>,
    runs: Vec<FlowerRun>,
    config_maps: Vec<ConfigMap>,
}

impl Manifests {
    /// Watches `dir` (nothing is read until [`Manifests::refresh`]); Federations are judged by
    /// the hub admin's pod `policy` as well as by their own rules ([`crate::core::problems`]).
    pub fn new(dir: PathBuf, policy: PodPolicy) -> Self {
        Self {
            dir,
            policy,
            fingerprint: Vec::new(),
            by_file: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    /// Re-reads the directory when a file was added, removed or changed; true when it did.
    pub fn refresh(&mut self) -> bool {
        let files = yaml_files(&self.dir);
        let fingerprint: Vec<(PathBuf, SystemTime, u64)> = files
            .iter()
            .filter_map(|p| {
                let meta = std::fs::metadata(p).ok()?;
                Some((p.clone(), meta.modified().ok()?, meta.len()))
            })
            .collect();
        if fingerprint == self.fingerprint && !self.fingerprint.is_empty() {
            return false;
        }
        self.fingerprint = fingerprint;
        self.problems.clear();
        if !self.dir.is_dir() {
            self.problems.push(format!(
                "{}: manifests directory not found",
                self.dir.display()
            ));
        }
        self.by_file.retain(|path, _| files.contains(path));
        for path in files {
            match load_file(&path, &self.policy) {
                Ok(objects) => {
                    self.by_file.insert(path, objects);
                }
                Err(problems) => {
                    self.problems.extend(problems);
                }
            }
        }
        true
    }

    /// Problems of the last read, one line each (`FILE: field.path: message`).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Every valid Federation (the last valid version of each file), sorted by namespace/name.
    pub fn federations(&self) -> impl Iterator<Item = &Federation> {
        let mut all: BTreeMap<Key, &Federation> = BTreeMap::new();
        for objects in self.by_file.values() {
            for f in &objects.federations {
                all.insert(key(&f.metadata), f);
            }
        }
        all.into_values()
    }

    /// The Placement `namespace/name`, if a valid one exists.
    pub fn placement(&self, namespace: &str, name: &str) -> Option<&Placement> {
        self.placements()
            .find(|p| key(&p.metadata) == (namespace.to_owned(), name.to_owned()))
    }

    /// Every valid Placement, sorted by namespace/name (the last file wins for a name).
    pub fn placements(&self) -> impl Iterator<Item = &Placement> {
        let mut all: BTreeMap<Key, &Placement> = BTreeMap::new();
        for objects in self.by_file.values() {
            for p in &objects.placements {
                all.insert(key(&p.metadata), p);
            }
        }
        all.into_values()
    }

    /// Every valid ManagedClusterSet, sorted by name (the last file wins for a name).
    pub fn cluster_sets(&self) -> Vec<crate::core::clustersets::ClusterSetView> {
        let mut all: BTreeMap<String, &ManagedClusterSet> = BTreeMap::new();
        for objects in self.by_file.values() {
            for set in &objects.cluster_sets {
                all.insert(set.metadata.name.clone().unwrap_or_default(), set);
            }
        }
        all.into_values()
            .map(crate::core::clustersets::ClusterSetView::from_api)
            .collect()
    }

    /// Every valid FlowerRun, sorted by namespace/name (the last file wins for a name).
    pub fn flower_runs(&self) -> impl Iterator<Item = &FlowerRun> {
        let mut all: BTreeMap<Key, &FlowerRun> = BTreeMap::new();
        for objects in self.by_file.values() {
            for r in &objects.runs {
                all.insert(key(&r.metadata), r);
            }
        }
        all.into_values()
    }

    /// The ConfigMap `namespace/name`, if one is in the directory.
    pub fn config_map(&self, namespace: &str, name: &str) -> Option<&ConfigMap> {
        let wanted = (namespace.to_owned(), name.to_owned());
        self.by_file
            .values()
            .flat_map(|o| o.config_maps.iter())
            .rfind(|c| key(&c.metadata) == wanted)
    }

    /// `(namespace, set)` of every valid ManagedClusterSetBinding.
    pub fn cluster_set_bindings(&self) -> Vec<(String, String)> {
        crate::core::clustersets::binding_pairs(
            self.by_file.values().flat_map(|o| o.bindings.iter()),
        )
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Keeps `object` of file `file` in `into` when `validate` finds nothing wrong (a namespaced
/// object without a namespace is in `default`); otherwise adds one problem per field.
fn keep<T: kube::Resource>(
    file: &str,
    mut object: T,
    namespaced: bool,
    validate: impl Fn(&T) -> Vec<(String, String)>,
    into: &mut Vec<T>,
    problems: &mut Vec<String>,
) {
    if namespaced && object.meta().namespace.is_none() {
        object.meta_mut().namespace = Some("default".into());
    }
    let errors = validate(&object);
    if errors.is_empty() {
        into.push(object);
    } else {
        problems.extend(
            errors
                .iter()
                .map(|(path, message)| format!("{file}: {path}: {message}")),
        );
    }
}

/// `validate` as `(field path, message)` pairs.
fn fields<T>(
    validate: fn(&T) -> Vec<flower_addon_crds::FieldError>,
) -> impl Fn(&T) -> Vec<(String, String)> {
    move |object| {
        validate(object)
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect()
    }
}

const ONLY_THESE_KINDS: &str = "only Federation, Placement, ManagedClusterSet, ManagedClusterSetBinding, FlowerRun and ConfigMap objects belong in the manifests directory";

/// Reads and validates one file; all or nothing.
fn load_file(path: &Path, policy: &PodPolicy) -> Result<FileObjects, Vec<String>> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{name}: {e}")])?;
    let objects =
        flower_addon_crds::parse_documents(&name, &text).map_err(|e| vec![e.to_string()])?;
    let mut out = FileObjects::default();
    let mut problems = Vec::new();
    for object in objects {
        use flower_addon_crds::Object;
        let p = &mut problems;
        match object {
            Object::Federation(f) => keep(
                &name,
                f,
                true,
                |f| crate::core::problems::problems(f, policy),
                &mut out.federations,
                p,
            ),
            Object::Placement(pl) => keep(
                &name,
                pl,
                true,
                fields(validate_placement),
                &mut out.placements,
                p,
            ),
            Object::ManagedClusterSet(set) => keep(
                &name,
                set,
                false,
                fields(validate_cluster_set),
                &mut out.cluster_sets,
                p,
            ),
            Object::ManagedClusterSetBinding(b) => keep(
                &name,
                b,
                true,
                fields(validate_cluster_set_binding),
                &mut out.bindings,
                p,
            ),
            Object::FlowerRun(r) => keep(
                &name,
                r,
                true,
                fields(validate_flower_run),
                &mut out.runs,
                p,
            ),
            Object::ConfigMap(c) => keep(&name, c, true, |_| Vec::new(), &mut out.config_maps, p),
            _ => p.push(format!("{name}: {ONLY_THESE_KINDS}")),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_crds::policy::Admin;

    const GOOD: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: demo}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink: {image: "flwr/superlink:1.42.0"}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: [{name: a, replicas: 2, images: {}}]
"#;

    #[test]
    fn a_bad_edit_keeps_the_last_valid_version_and_names_the_field() {
        // A broken file is reported with file and field, and its objects keep their last valid
        // version instead of disappearing (which would tear down a running federation).
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fed.yaml");
        std::fs::write(&file, GOOD).unwrap();
        std::fs::write(dir.path().join("other.yaml"), "kind: [").unwrap();
        let mut m = Manifests::new(dir.path().into(), PodPolicy::new(Admin::Hub));
        assert!(m.refresh());
        assert_eq!(m.federations().count(), 1);
        assert_eq!(m.problems().len(), 1, "{:?}", m.problems());
        assert!(m.problems()[0].contains("other.yaml"));

        std::fs::write(&file, GOOD.replace("replicas: 2", "replicas: 0")).unwrap();
        // mtime granularity: make sure the change is seen
        let later = SystemTime::now() + std::time::Duration::from_secs(2);
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_modified(later).unwrap();
        assert!(m.refresh());
        let feds: Vec<&Federation> = m.federations().collect();
        assert_eq!(feds[0].spec.supernodes.pools[0].replicas, Some(2));
        assert!(
            m.problems()
                .iter()
                .any(|p| p.contains("fed.yaml") && p.contains("replicas")),
            "{:?}",
            m.problems()
        );
    }

    #[test]
    fn path_like_names_are_problems_not_federations() {
        // `namespace: "../../.."` would become a directory under the state dir: refused with
        // the file and field, and never loaded.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("evil.yaml"),
            GOOD.replace(
                "metadata: {name: demo}",
                "metadata: {name: demo, namespace: \"../../..\"}",
            ),
        )
        .unwrap();
        let mut m = Manifests::new(dir.path().into(), PodPolicy::new(Admin::Hub));
        m.refresh();
        assert_eq!(m.federations().count(), 0);
        assert!(
            m.problems()
                .iter()
                .any(|p| p.contains("evil.yaml") && p.contains("metadata.namespace")),
            "{:?}",
            m.problems()
        );
    }
}
