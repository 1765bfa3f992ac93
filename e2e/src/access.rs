//! Least-privilege identities: a ServiceAccount with RBAC from a manifest, its token (TokenRequest
//! API) as a kubeconfig and client, and SubjectAccessReview checks.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::apply::{ApplyOptions, apply_file_with};
use crate::cluster::Cluster;
use crate::kubeconfig;

/// Kinds applied by [`service_account_access`]: identity and RBAC only.
pub const RBAC_KINDS: &[&str] = &[
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// A ServiceAccount's credentials on one cluster.
#[derive(Clone)]
pub struct SaAccess {
    /// Namespace of the ServiceAccount.
    pub namespace: String,
    /// Name of the ServiceAccount.
    pub name: String,
    /// Kubeconfig authenticating with the SA's token.
    pub kubeconfig: PathBuf,
    /// Bearer token from the TokenRequest API.
    pub token: String,
    /// Client authenticating with the SA's token.
    pub client: Client,
}

impl SaAccess {
    /// The SA's user name, `system:serviceaccount:<ns>:<name>`.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// Applies the identity and RBAC documents ([`RBAC_KINDS`]) of `manifest` to `cluster` as admin,
/// then issues a token for ServiceAccount `namespace/name` (TokenRequest, `ttl_seconds`) and
/// returns a kubeconfig (written into the cluster's dir) and a client using it.
pub async fn service_account_access(
    cluster: &Cluster,
    manifest: &Path,
    namespace: &str,
    name: &str,
    ttl_seconds: i64,
) -> Result<SaAccess> {
    apply_file_with(
        &cluster.client,
        manifest,
        namespace,
        ApplyOptions {
            kinds: Some(RBAC_KINDS),
            dry_run: false,
        },
    )
    .await?;
    service_account_token(cluster, namespace, name, ttl_seconds).await
}

/// Issues a token for an existing ServiceAccount and returns a kubeconfig and client using it.
pub async fn service_account_token(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    ttl_seconds: i64,
) -> Result<SaAccess> {
    let sas: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), namespace);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(ttl_seconds),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = sas
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .with_context(|| format!("TokenRequest for {namespace}/{name} on {}", cluster.name))?;
    let token = issued
        .status
        .and_then(|s| s.token)
        .context("TokenRequest returned no token")?;
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let kc = cluster.write_kubeconfig(&format!("{namespace}.{name}.kubeconfig"), &user, &token)?;
    let client = kubeconfig::client(&kc).await?;
    Ok(SaAccess {
        namespace: namespace.to_string(),
        name: name.to_string(),
        kubeconfig: kc,
        token,
        client,
    })
}

/// One question for [`can_i`]: may the subject do `verb` on `group/resource` (optionally a
/// subresource, in a namespace)?
#[derive(Debug, Clone, Default)]
pub struct Access<'a> {
    /// Verb (`get`, `list`, `create`, `delete`, `patch`, …).
    pub verb: &'a str,
    /// API group (`""` for core).
    pub group: &'a str,
    /// Resource (plural).
    pub resource: &'a str,
    /// Subresource (`status`, …).
    pub subresource: Option<&'a str>,
    /// Namespace (`None`: cluster-wide).
    pub namespace: Option<&'a str>,
}

/// Asks the apiserver (SubjectAccessReview, as `admin`) whether the ServiceAccount may do `what`.
pub async fn can_i(admin: &Client, sa: &SaAccess, what: &Access<'_>) -> Result<bool> {
    let sars: Api<SubjectAccessReview> = Api::all(admin.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(sa.user()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", sa.namespace),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(what.verb.into()),
                group: Some(what.group.into()),
                resource: Some(what.resource.into()),
                subresource: what.subresource.map(Into::into),
                namespace: what.namespace.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = sars
        .create(&PostParams::default(), &review)
        .await
        .context("SubjectAccessReview")?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}
