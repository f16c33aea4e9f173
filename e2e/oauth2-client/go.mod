module selkie.dev/e2e/oauth2-client

go 1.24.0

require golang.org/x/oauth2 v0.35.0
