//! Hand-written schemas for the Kubernetes types the CRDs embed.
//!
//! k8s-openapi's own `JsonSchema` impls sit behind its `schemars` feature (a large amount of code to
//! compile for two types) and omit the validation `metav1.Condition` declares, so the few fields
//! that embed a k8s-openapi type name one of these functions with `#[schemars(schema_with = ..)]`.

use schemars::{json_schema, Schema, SchemaGenerator};

/// `[]metav1.Condition` as Kubernetes declares it for status conditions: a list map keyed by
/// `type` (so server-side apply merges conditions by type), with `metav1.Condition`'s own
/// validation (CamelCase reason, bounded message, True/False/Unknown status).
pub(crate) fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "description": "One aspect of the object's current state (metav1.Condition).",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "When the condition last changed status.",
                    "type": "string",
                    "format": "date-time",
                },
                "message": {
                    "description": "Human-readable details; may be empty.",
                    "type": "string",
                    "maxLength": 32768,
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was computed from.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0,
                },
                "reason": {
                    "description": "Machine-readable CamelCase reason for the last transition.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"],
                },
                "type": {
                    "description": "The condition's name, CamelCase or foo.example.com/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                },
            },
        },
    })
}

/// `metav1.Time`: an RFC 3339 timestamp.
pub(crate) fn time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "format": "date-time",
    })
}

/// `corev1.TypedLocalObjectReference`: an object of a given kind in the referrer's namespace,
/// replaced as a whole by server-side apply (atomic).
pub(crate) fn typed_local_object_reference(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "required": ["kind", "name"],
        "properties": {
            "apiGroup": {
                "description": "The referenced object's API group; the core group when absent.",
                "type": "string",
            },
            "kind": {
                "description": "The referenced object's kind.",
                "type": "string",
            },
            "name": {
                "description": "The referenced object's name.",
                "type": "string",
            },
        },
    })
}

/// `corev1.LocalObjectReference`: an object (of a kind the field implies) in the referrer's
/// namespace, replaced as a whole by server-side apply (atomic).
pub(crate) fn local_object_reference(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "name": {
                "description": "The referenced object's name; empty means none.",
                "type": "string",
                "default": "",
            },
        },
    })
}

/// Drops the `default` schemars derives from `#[serde(default)]`, for a field Pinniped's schema
/// gives no default although absent reads as zero.
pub(crate) fn no_default(schema: &mut Schema) {
    schema.remove("default");
}
