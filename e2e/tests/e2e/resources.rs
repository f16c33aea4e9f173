//! CustomResourceDefinitions work the GitOps way: `kubectl apply`, then create, read and delete.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use selkie_e2e::Cluster;

use crate::eventually;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.e2e.selkie.dev
spec:
  group: e2e.selkie.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
"#;

#[tokio::test]
async fn crd_is_applied_and_its_resources_are_created_read_and_deleted() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "crd").await?;
    let kubectl = cluster.kubectl();

    kubectl.run_with_stdin(&["apply", "-f", "-"], Some(CRD)).await?;
    kubectl
        .run(&[
            "wait",
            "--for=condition=Established",
            "crd/widgets.e2e.selkie.dev",
            "--timeout=60s",
        ])
        .await?;

    let widget = format!(
        "apiVersion: e2e.selkie.dev/v1\nkind: Widget\nmetadata: {{name: w1, namespace: {ns}}}\nspec: {{size: 3}}\n"
    );
    // Discovery of the new type can lag Established by a moment.
    eventually(Duration::from_secs(15), || async {
        Ok(kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&widget))
            .await?)
    })
    .await?;

    // Read back through kube-rs, with the dynamic API.
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("e2e.selkie.dev", "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
    let read = widgets.get("w1").await?;
    assert_eq!(read.data["spec"]["size"], 3);

    // The schema is enforced by the real apiserver.
    let invalid = widget.replace("size: 3", "size: 0");
    let rejected = kubectl.output(&["apply", "-f", "-"], Some(&invalid)).await?;
    assert!(
        !rejected.success,
        "size 0 violates minimum 1 and must be rejected"
    );
    assert!(rejected.stderr.contains("spec.size"), "{}", rejected.stderr);

    kubectl
        .run(&["delete", "widget", "w1", "-n", &ns, "--wait=true"])
        .await?;
    assert!(
        widgets.get_opt("w1").await?.is_none(),
        "w1 must be gone after delete"
    );
    Ok(())
}
