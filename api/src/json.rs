//! JSON errors told without the input: serde_json's messages quote the values they met, which
//! may be a token or a password a peer sent; every error Selkie logs or returns about a JSON
//! document it did not write goes through [`error_without_values`].

/// What kind of mistake `error` is (`unreadable`, `not JSON`, `JSON of the wrong shape`,
/// `truncated JSON`) and, when serde knows it, where (`at line L column C`); never a value.
pub fn error_without_values(error: &serde_json::Error) -> String {
    let kind = match error.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "JSON of the wrong shape",
        serde_json::error::Category::Eof => "truncated JSON",
    };
    if error.line() > 0 {
        format!("{kind} at line {} column {}", error.line(), error.column())
    } else {
        kind.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_never_quoted() {
        #[derive(Debug, serde::Deserialize)]
        struct Flag {
            #[expect(dead_code, reason = "only parsed")]
            on: bool,
        }
        let error = serde_json::from_str::<Flag>(r#"{"on": "s3cr3t"}"#).unwrap_err();
        assert!(error.to_string().contains("s3cr3t"), "serde quotes it");
        let told = error_without_values(&error);
        assert_eq!(told, "JSON of the wrong shape at line 1 column 15");
        let value_error = serde_json::from_value::<Flag>(serde_json::json!({"on": "s3cr3t"})).unwrap_err();
        assert_eq!(error_without_values(&value_error), "JSON of the wrong shape");
        assert!(
            error_without_values(&serde_json::from_str::<Flag>("{").unwrap_err())
                .starts_with("truncated JSON")
        );
    }
}
