package main

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/AthenZ/athenz/clients/go/zts"
	"github.com/ardielle/ardielle-go/rdl"
)

const form = "application/x-www-form-urlencoded"

// call sends one request through zts.ZTSClient and reads the answer with its model.
func call(r *request) (answer, error) {
	if r.Op == "access_token" && r.ContentType != "" && r.ContentType != form {
		return answer{Unsendable: "Athenz's Go client sends the access token request as a form, never " + r.ContentType}, nil
	}
	transport, err := r.transport()
	if err != nil {
		return answer{}, err
	}
	client := zts.NewClient(r.URL, transport)
	decoded, status, err := send(&client, r)
	if errors.Is(err, errModelRefuses) {
		return answer{Unsendable: err.Error()}, nil
	}
	var refusal rdl.ResourceError
	if errors.As(err, &refusal) {
		return answer{Status: refusal.Code, Message: refusal.Message}, nil
	}
	if err != nil {
		return answer{}, err
	}
	return answer{Status: status, Decoded: decoded}, nil
}

// send makes the call; on success, the answer's fields as the model holds them and the status
// the client requires of that route (it treats any other as an error).
func send(client *zts.ZTSClient, r *request) (map[string]any, int, error) {
	switch r.Op {
	case "register":
		var info zts.InstanceRegisterInformation
		if err := r.into(&info); err != nil {
			return nil, 0, err
		}
		identity, location, err := client.PostInstanceRegisterInformation(&info)
		if err != nil {
			return nil, 0, err
		}
		decoded, err := instanceIdentity(identity)
		if err == nil && location == "" {
			err = errors.New("a 201 without Location")
		}
		return decoded, 201, err
	case "refresh":
		var info zts.InstanceRefreshInformation
		if err := r.into(&info); err != nil {
			return nil, 0, err
		}
		identity, err := client.PostInstanceRefreshInformation(zts.ServiceName(r.Provider), zts.DomainName(r.Domain), zts.SimpleName(r.Service), zts.PathElement(r.InstanceID), &info)
		if err != nil {
			return nil, 0, err
		}
		decoded, err := instanceIdentity(identity)
		return decoded, 200, err
	case "key_refresh":
		var req zts.InstanceRefreshRequest
		if err := r.into(&req); err != nil {
			return nil, 0, err
		}
		client.AddCredentials("Athenz-Principal-Auth", r.Ntoken)
		identity, err := client.PostInstanceRefreshRequest(zts.CompoundName(r.Domain), zts.SimpleName(r.Service), &req)
		if err != nil {
			return nil, 0, err
		}
		cn, err := commonName("certificate", identity.Certificate)
		return map[string]any{"name": string(identity.Name), "certificateCn": cn}, 200, err
	case "access_token":
		response, err := client.PostAccessTokenRequest(zts.AccessTokenRequest(r.Form))
		if err != nil {
			return nil, 0, err
		}
		decoded, err := accessToken(response)
		return decoded, 200, err
	case "role_token":
		token, err := client.GetRoleToken(zts.DomainName(r.Domain), zts.EntityList(r.Role), nil, nil, "")
		if err != nil {
			return nil, 0, err
		}
		if !strings.HasPrefix(token.Token, "v=Z1;") {
			return nil, 0, fmt.Errorf("a role token not of version Z1: %.20q", token.Token)
		}
		return map[string]any{"expiryTime": token.ExpiryTime}, 200, nil
	case "role_cert":
		var req zts.RoleCertificateRequest
		if err := r.into(&req); err != nil {
			return nil, 0, err
		}
		cert, err := client.PostRoleCertificateRequestExt(&req)
		if err != nil {
			return nil, 0, err
		}
		cn, err := commonName("x509Certificate", cert.X509Certificate)
		return map[string]any{"certificateCn": cn}, 200, err
	case "jwks":
		rfc := true
		keys, err := client.GetJWKList(&rfc, "")
		if err != nil {
			return nil, 0, err
		}
		if len(keys.Keys) == 0 {
			return nil, 0, errors.New("the JWKS has no keys")
		}
		kids := []string{}
		for _, k := range keys.Keys {
			kids = append(kids, k.Kid+":"+k.Kty)
		}
		return map[string]any{"kids": kids}, 200, nil
	}
	return nil, 0, fmt.Errorf("unknown op %q", r.Op)
}

func commonName(field, certPEM string) (string, error) {
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil {
		return "", fmt.Errorf("the answer's %s is not PEM", field)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("the answer's %s: %w", field, err)
	}
	return cert.Subject.CommonName, nil
}

func instanceIdentity(identity *zts.InstanceIdentity) (map[string]any, error) {
	cn, err := commonName("x509Certificate", identity.X509Certificate)
	if err != nil {
		return nil, err
	}
	if identity.InstanceId == "" || identity.Provider == "" || identity.Name == "" {
		return nil, errors.New("an InstanceIdentity without provider, name or instanceId")
	}
	return map[string]any{"provider": string(identity.Provider), "name": string(identity.Name), "instanceId": string(identity.InstanceId), "certificateCn": cn}, nil
}

// accessToken reads the model, then the token's claims (Java's harness verifies its signature).
func accessToken(response *zts.AccessTokenResponse) (map[string]any, error) {
	parts := strings.Split(response.Access_token, ".")
	if len(parts) != 3 {
		return nil, errors.New("an access token that is not a JWS")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("the access token's claims: %w", err)
	}
	var claims struct {
		ClientID string `json:"client_id"`
		Aud      string `json:"aud"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, fmt.Errorf("the access token's claims: %w", err)
	}
	expires := int32(0)
	if response.Expires_in != nil {
		expires = *response.Expires_in
	}
	return map[string]any{"token_type": response.Token_type, "expires_in": expires, "scope": response.Scope, "client_id": claims.ClientID, "audience": claims.Aud}, nil
}
