package main

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

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
		if err == nil {
			decoded["location"] = "absent"
			if location != "" {
				decoded["location"] = "present"
			}
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
		if identity.Name == "" || identity.CaCertBundle == "" {
			return nil, 0, errors.New("an Identity without name or caCertBundle")
		}
		decoded := map[string]any{"name": string(identity.Name)}
		return decoded, 200, certificate(decoded, "certificate", identity.Certificate, identity.CaCertBundle)
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
		decoded, err := roleToken(token)
		return decoded, 200, err
	case "role_cert":
		var req zts.RoleCertificateRequest
		if err := r.into(&req); err != nil {
			return nil, 0, err
		}
		cert, err := client.PostRoleCertificateRequestExt(&req)
		if err != nil {
			return nil, 0, err
		}
		decoded := map[string]any{}
		return decoded, 200, certificate(decoded, "x509Certificate", cert.X509Certificate, "")
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

// parsePEM is the first certificate of a PEM text.
func parsePEM(field, certPEM string) (*x509.Certificate, error) {
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil {
		return nil, fmt.Errorf("the answer's %s is not PEM", field)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the answer's %s: %w", field, err)
	}
	return cert, nil
}

// certificate adds what harness/peers/athenz/java's Decoded reports of a certificate, under the same
// names: its CN, the whole minutes left until it expires, and (with a signer bundle) whether a
// certificate of the bundle signed it.
func certificate(decoded map[string]any, field, certPEM, signers string) error {
	cert, err := parsePEM(field, certPEM)
	if err != nil {
		return err
	}
	decoded["certificateCn"] = cert.Subject.CommonName
	decoded["expiresInMinutes"] = int64(math.Round(time.Until(cert.NotAfter).Minutes()))
	if signers == "" {
		return nil
	}
	signed := false
	for rest := []byte(signers); ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		ca, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return fmt.Errorf("the signer bundle: %w", err)
		}
		if cert.CheckSignatureFrom(ca) == nil {
			signed = true
		}
	}
	decoded["signerIsIssuer"] = signed
	return nil
}

func instanceIdentity(identity *zts.InstanceIdentity) (map[string]any, error) {
	if identity.InstanceId == "" || identity.Provider == "" || identity.Name == "" || identity.X509CertificateSigner == "" {
		return nil, errors.New("an InstanceIdentity without provider, name, instanceId or x509CertificateSigner")
	}
	decoded := map[string]any{"provider": string(identity.Provider), "name": string(identity.Name), "instanceId": string(identity.InstanceId)}
	return decoded, certificate(decoded, "x509Certificate", identity.X509Certificate, identity.X509CertificateSigner)
}

// roleToken reads the model, then the token's fields as Athenz's Java RoleToken class names
// them (d, r, p, t, e of "v=Z1;...").
func roleToken(token *zts.RoleToken) (map[string]any, error) {
	if !strings.HasPrefix(token.Token, "v=Z1;") {
		return nil, fmt.Errorf("a role token not of version Z1: %.20q", token.Token)
	}
	fields := map[string]string{}
	for _, item := range strings.Split(token.Token, ";") {
		if name, value, ok := strings.Cut(item, "="); ok {
			fields[name] = value
		}
	}
	issued, err1 := strconv.ParseInt(fields["t"], 10, 64)
	expires, err2 := strconv.ParseInt(fields["e"], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("the role token's times: %w", err)
	}
	if expires != token.ExpiryTime {
		return nil, fmt.Errorf("expiryTime %d is not the token's %d", token.ExpiryTime, expires)
	}
	return map[string]any{"domain": fields["d"], "principal": fields["p"], "roles": fields["r"], "lifetimeSeconds": expires - issued}, nil
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
		ClientID string   `json:"client_id"`
		Aud      string   `json:"aud"`
		Sub      string   `json:"sub"`
		Scp      []string `json:"scp"`
		Iat      int64    `json:"iat"`
		Exp      int64    `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, fmt.Errorf("the access token's claims: %w", err)
	}
	expires := int32(0)
	if response.Expires_in != nil {
		expires = *response.Expires_in
	}
	return map[string]any{"token_type": response.Token_type, "expires_in": expires, "scope": response.Scope, "client_id": claims.ClientID, "audience": claims.Aud, "subject": claims.Sub, "roles": strings.Join(claims.Scp, ","), "lifetimeSeconds": claims.Exp - claims.Iat}, nil
}
