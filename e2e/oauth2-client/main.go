// Command selkie-oauth2-client is the OAuth 2.0 client of Selkie's e2e tests that is the library
// the pinniped CLI itself uses: golang.org/x/oauth2 with its defaults. The Config names the public
// client pinniped-cli with no secret and leaves Endpoint.AuthStyle at its zero value, so the
// library probes the token endpoint's client authentication as it does for the CLI: first HTTP
// Basic with the client ID and an empty secret, and only when that is refused, client_id in the
// body.
//
// It reads the Supervisor's discovery document at -issuer (trusting only the CA in -ca-file),
// redeems the authorization code -code (Config.Exchange, PKCE verifier -verifier, -redirect-uri),
// then refreshes the token it got with a second, fresh Config (a later run of the CLI, which
// probes again) through Config.TokenSource with the token marked expired.
//
// It prints one JSON report on stdout with non-secret facts only — which tokens came back, their
// type, whether an expiry was given, and every token request as the server saw it (grant type,
// how the client authenticated, answer status and OAuth error code) — never a token, a code or
// the verifier. It exits 1 when a step failed, 2 when it could not start.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/oauth2"
)

// tokenRequest is one request to the token endpoint as it went over the wire.
type tokenRequest struct {
	GrantType        string `json:"grant_type"`
	Auth             string `json:"auth"` // "basic" or "none" (no Authorization header)
	BasicClientID    string `json:"basic_client_id,omitempty"`
	BasicSecretEmpty bool   `json:"basic_secret_empty,omitempty"`
	BodyClientID     string `json:"body_client_id,omitempty"`
	BodyClientSecret bool   `json:"body_client_secret"`
	Status           int    `json:"status"`
	Error            string `json:"error,omitempty"` // the OAuth 2.0 error code of a refusal
}

// grantResult describes the token a grant returned.
type grantResult struct {
	OK                 bool   `json:"ok"`
	Error              string `json:"error,omitempty"`
	TokenType          string `json:"token_type,omitempty"`
	HasAccessToken     bool   `json:"has_access_token"`
	AccessTokenFormat  bool   `json:"access_token_pinniped_format"`
	HasRefreshToken    bool   `json:"has_refresh_token"`
	RefreshTokenFormat bool   `json:"refresh_token_pinniped_format"`
	HasIDToken         bool   `json:"has_id_token"`
	ExpirySet          bool   `json:"expiry_set"`
	ExpiresInFuture    bool   `json:"expires_in_future"`
	RefreshTokenNew    *bool  `json:"refresh_token_rotated,omitempty"`
}

type report struct {
	OK                  bool           `json:"ok"`
	Error               string         `json:"error,omitempty"`
	Library             string         `json:"library"`
	AuthStyle           string         `json:"auth_style"`
	TokenEndpoint       string         `json:"token_endpoint,omitempty"`
	CodeChallenge       string         `json:"code_challenge,omitempty"`
	CodeChallengeMethod string         `json:"code_challenge_method,omitempty"`
	Exchange            *grantResult   `json:"exchange,omitempty"`
	Refresh             *grantResult   `json:"refresh,omitempty"`
	TokenRequests       []tokenRequest `json:"token_requests"`
}

// recorder is an http.RoundTripper that notes how each token request authenticated and how it
// was answered, without keeping any parameter's value but the grant type and the client ID.
type recorder struct {
	next     http.RoundTripper
	tokenURL string
	requests []tokenRequest
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || r.tokenURL == "" || req.URL.String() != r.tokenURL {
		return r.next.RoundTrip(req)
	}
	var seen tokenRequest
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if form, err := url.ParseQuery(string(body)); err == nil {
			seen.GrantType = form.Get("grant_type")
			seen.BodyClientID = form.Get("client_id")
			seen.BodyClientSecret = form.Has("client_secret")
		}
	}
	seen.Auth = "none"
	if id, secret, ok := req.BasicAuth(); ok {
		seen.Auth = "basic"
		if unescaped, err := url.QueryUnescape(id); err == nil {
			id = unescaped
		}
		seen.BasicClientID = id
		seen.BasicSecretEmpty = secret == ""
	} else if req.Header.Get("Authorization") != "" {
		seen.Auth = "other"
	}
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		r.requests = append(r.requests, seen)
		return nil, err
	}
	seen.Status = resp.StatusCode
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, readErr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if readErr == nil {
			var answer struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(body, &answer) == nil {
				seen.Error = answer.Error
			}
		}
	}
	r.requests = append(r.requests, seen)
	return resp, nil
}

func describe(tok *oauth2.Token, err error) *grantResult {
	if err != nil {
		return &grantResult{Error: refusal(err)}
	}
	idToken, _ := tok.Extra("id_token").(string)
	return &grantResult{
		OK:                 true,
		TokenType:          tok.Type(),
		HasAccessToken:     tok.AccessToken != "",
		AccessTokenFormat:  strings.HasPrefix(tok.AccessToken, "pin_at_"),
		HasRefreshToken:    tok.RefreshToken != "",
		RefreshTokenFormat: strings.HasPrefix(tok.RefreshToken, "pin_rt_"),
		HasIDToken:         idToken != "",
		ExpirySet:          !tok.Expiry.IsZero(),
		ExpiresInFuture:    tok.Expiry.After(time.Now()),
	}
}

// refusal is what may be said of a failed grant: the OAuth 2.0 error code and description the
// server answered with, or the transport error (none of them holds a token).
func refusal(err error) string {
	var retrieve *oauth2.RetrieveError
	if errors.As(err, &retrieve) {
		if retrieve.ErrorCode != "" {
			return fmt.Sprintf("%d %s: %s", retrieve.Response.StatusCode, retrieve.ErrorCode, retrieve.ErrorDescription)
		}
		return fmt.Sprintf("%d (no OAuth error code)", retrieve.Response.StatusCode)
	}
	return err.Error()
}

// discover reads the endpoints from the issuer's OpenID Provider metadata.
func discover(ctx context.Context, client *http.Client, issuer string) (oauth2.Endpoint, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(issuer, "/")+"/.well-known/openid-configuration", nil)
	if err != nil {
		return oauth2.Endpoint{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return oauth2.Endpoint{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return oauth2.Endpoint{}, fmt.Errorf("discovery answered %d", resp.StatusCode)
	}
	var doc struct {
		Issuer                string `json:"issuer"`
		AuthorizationEndpoint string `json:"authorization_endpoint"`
		TokenEndpoint         string `json:"token_endpoint"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc); err != nil {
		return oauth2.Endpoint{}, fmt.Errorf("discovery document: %w", err)
	}
	if doc.Issuer != issuer {
		return oauth2.Endpoint{}, fmt.Errorf("discovery names issuer %q, not %q", doc.Issuer, issuer)
	}
	if doc.AuthorizationEndpoint == "" || doc.TokenEndpoint == "" {
		return oauth2.Endpoint{}, fmt.Errorf("discovery lacks an authorization or token endpoint")
	}
	// AuthStyle stays AuthStyleAutoDetect, the zero value, as in the pinniped CLI.
	return oauth2.Endpoint{AuthURL: doc.AuthorizationEndpoint, TokenURL: doc.TokenEndpoint}, nil
}

func main() {
	issuer := flag.String("issuer", "", "the FederationDomain's issuer URL")
	caFile := flag.String("ca-file", "", "PEM file of the CA to trust for the issuer (only it)")
	code := flag.String("code", "", "the authorization code to redeem")
	redirectURI := flag.String("redirect-uri", "", "the redirect URI of the authorization request")
	verifier := flag.String("verifier", "", "the PKCE code verifier of the authorization request")
	clientID := flag.String("client-id", "pinniped-cli", "the OAuth 2.0 client ID")
	timeout := flag.Duration("timeout", 60*time.Second, "the time the whole run may take")
	flag.Parse()
	if *issuer == "" || *caFile == "" || *code == "" || *redirectURI == "" || *verifier == "" {
		fmt.Fprintln(os.Stderr, "usage: selkie-oauth2-client -issuer URL -ca-file FILE -code CODE -redirect-uri URI -verifier VERIFIER")
		os.Exit(2)
	}
	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "reading the CA: %v\n", err)
		os.Exit(2)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		fmt.Fprintf(os.Stderr, "%s holds no PEM certificate\n", *caFile)
		os.Exit(2)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	rec := &recorder{next: transport}
	httpClient := &http.Client{Transport: rec, Timeout: 30 * time.Second}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx = context.WithValue(ctx, oauth2.HTTPClient, httpClient)

	out := report{Library: "golang.org/x/oauth2", AuthStyle: "AuthStyleAutoDetect"}
	finish := func() {
		out.TokenRequests = rec.requests
		if out.TokenRequests == nil {
			out.TokenRequests = []tokenRequest{}
		}
		out.OK = out.Error == "" && out.Exchange != nil && out.Exchange.OK && out.Refresh != nil && out.Refresh.OK
		encoded, _ := json.MarshalIndent(out, "", "  ")
		fmt.Println(string(encoded))
		if !out.OK {
			os.Exit(1)
		}
	}

	endpoint, err := discover(ctx, httpClient, *issuer)
	if err != nil {
		out.Error = "discovery: " + err.Error()
		finish()
		return
	}
	rec.tokenURL = endpoint.TokenURL
	out.TokenEndpoint = endpoint.TokenURL
	newConfig := func() *oauth2.Config {
		return &oauth2.Config{ClientID: *clientID, Endpoint: endpoint, RedirectURL: *redirectURI}
	}

	// The challenge the library derives for this verifier, as it would put it in the
	// authorization request.
	if authURL, err := url.Parse(newConfig().AuthCodeURL("state", oauth2.S256ChallengeOption(*verifier))); err == nil {
		out.CodeChallenge = authURL.Query().Get("code_challenge")
		out.CodeChallengeMethod = authURL.Query().Get("code_challenge_method")
	}

	// (a) The code redeemed, as the CLI does after its callback.
	token, err := newConfig().Exchange(ctx, *code, oauth2.VerifierOption(*verifier))
	out.Exchange = describe(token, err)
	if err != nil {
		finish()
		return
	}

	// (b) A refresh by a fresh Config (a later run of the CLI: nothing cached about the server's
	// preferred client authentication), through the TokenSource with the token expired.
	expired := &oauth2.Token{RefreshToken: token.RefreshToken, Expiry: time.Now().Add(-time.Hour)}
	refreshed, err := newConfig().TokenSource(ctx, expired).Token()
	out.Refresh = describe(refreshed, err)
	if err == nil {
		rotated := refreshed.RefreshToken != "" && refreshed.RefreshToken != token.RefreshToken
		out.Refresh.RefreshTokenNew = &rotated
	}
	finish()
}
