//! IdentityService: the embedded CA, PSKs, join tokens and JWT-SVIDs (contract §10). Thin:
//! unpack, call the identity domain with the caller's principal, pack.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::principal;
use crate::identity::jwt::{self, JwtView};
use crate::identity::{self, CertificateInfo, TokenView};
use crate::proto;
use crate::server::Context;
use crate::Error;

pub struct Identity {
    pub context: Arc<Context>,
}

fn certificate(info: CertificateInfo) -> proto::Certificate {
    proto::Certificate {
        subject: info.subject,
        fingerprint: info.fingerprint,
        not_before: info.not_before,
        not_after: info.not_after,
    }
}

fn ca_info_response(info: identity::CaInfo) -> proto::CaInfoResponse {
    proto::CaInfoResponse {
        root_ca: Some(certificate(info.root_ca)),
        signing_ca: Some(certificate(info.signing_ca)),
    }
}

fn command_key_response(info: identity::CommandKeyInfo) -> proto::CommandKeyResponse {
    proto::CommandKeyResponse {
        current: Some(certificate(info.current)),
        previous: info.previous.map(certificate),
        retire_after: info.retire_after,
        agents: info.agents.map(|d| proto::CommandKeyDelivery {
            updated: d.updated,
            refused: d.refused,
            no_answer: d.no_answer,
            unreachable: d.unreachable,
        }),
    }
}

fn token_message(view: TokenView, cleartext: String) -> proto::JoinToken {
    proto::JoinToken {
        id: view.id,
        token: cleartext,
        agent_id: view.agent_id.unwrap_or_default(),
        created_at: view.created_at,
        expires_at: view.expires_at,
        used_at: view.used_at.unwrap_or_default(),
        revoked_at: view.revoked_at.unwrap_or_default(),
        state: view.state,
        created_by: view.created_by,
        used_by: view.used_by.unwrap_or_default(),
    }
}

fn jwt_message(view: JwtView, token: String) -> proto::JwtSvid {
    proto::JwtSvid {
        id: view.id,
        token,
        subject: view.subject,
        audience: view.audience,
        kid: view.kid,
        issued_by: view.issued_by,
        issued_at: view.issued_at,
        expires_at: view.expires_at,
        revoked_at: view.revoked_at.unwrap_or_default(),
        state: view.state,
    }
}

fn duration(text: String) -> Result<Option<std::time::Duration>, Error> {
    match optional(text) {
        Some(text) => crate::clock::parse_duration(&text)
            .map(Some)
            .ok_or_else(|| Error::Invalid(format!("invalid ttl '{text}' (e.g. 30m, 24h, 7d)"))),
        None => Ok(None),
    }
}

fn optional(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

#[tonic::async_trait]
impl proto::identity_service_server::IdentityService for Identity {
    async fn ca_info(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::CaInfoResponse>, Status> {
        let caller = principal(&request)?;
        let info = identity::ca_info(&self.context.domain, &caller).await?;
        Ok(Response::new(ca_info_response(info)))
    }

    async fn rotate_signing(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::CaInfoResponse>, Status> {
        let caller = principal(&request)?;
        let info = identity::rotate_signing(&self.context.domain, &caller).await?;
        Ok(Response::new(ca_info_response(info)))
    }

    async fn command_key_info(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::CommandKeyResponse>, Status> {
        let caller = principal(&request)?;
        let info = identity::command_key_status(&self.context.domain, &caller).await?;
        Ok(Response::new(command_key_response(info)))
    }

    async fn rotate_command_key(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::CommandKeyResponse>, Status> {
        let caller = principal(&request)?;
        let info = identity::rotate_command_key(&self.context.domain, &caller).await?;
        Ok(Response::new(command_key_response(info)))
    }

    async fn retire_command_key(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::CommandKeyResponse>, Status> {
        let caller = principal(&request)?;
        let info = identity::retire_command_key(&self.context.domain, &caller, false).await?;
        Ok(Response::new(command_key_response(info)))
    }

    async fn export_ca(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::ExportCaResponse>, Status> {
        let caller = principal(&request)?;
        let pem = identity::export_chain(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::ExportCaResponse { pem }))
    }

    async fn encrypt_ca(
        &self,
        request: Request<proto::EncryptCaRequest>,
    ) -> Result<Response<proto::EncryptCaResponse>, Status> {
        let caller = principal(&request)?;
        let passphrase = request.into_inner().passphrase;
        let data = identity::encrypt_ca(&self.context.domain, &caller, &passphrase).await?;
        Ok(Response::new(proto::EncryptCaResponse { data }))
    }

    async fn status(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::IdentityStatusResponse>, Status> {
        let caller = principal(&request)?;
        let status = identity::status(&self.context.domain, &caller).await?;
        let count = |state: &str| status.tokens.get(state).copied().unwrap_or(0);
        Ok(Response::new(proto::IdentityStatusResponse {
            tokens_unused: count("unused"),
            tokens_used: count("used"),
            tokens_revoked: count("revoked"),
            tokens_expired: count("expired"),
            provider: status.provider,
            health: status.health,
            ca_not_after: status.ca_not_after,
            detail: status.detail,
        }))
    }

    async fn psk(
        &self,
        request: Request<proto::PskRequest>,
    ) -> Result<Response<proto::PskResponse>, Status> {
        let caller = principal(&request)?;
        let agent_id = request.into_inner().agent_id;
        let psk = identity::psk(&self.context.domain, &caller, &agent_id).await?;
        Ok(Response::new(proto::PskResponse { psk }))
    }

    async fn create_token(
        &self,
        request: Request<proto::CreateTokenRequest>,
    ) -> Result<Response<proto::JoinToken>, Status> {
        let caller = principal(&request)?;
        let wanted = request.into_inner();
        let new = identity::NewToken {
            ttl: duration(wanted.ttl)?,
            agent_id: optional(wanted.agent_id),
        };
        let created = identity::create_token(&self.context.domain, &caller, new).await?;
        Ok(Response::new(token_message(
            created.token,
            created.cleartext,
        )))
    }

    async fn list_tokens(
        &self,
        request: Request<proto::ListTokensRequest>,
    ) -> Result<Response<proto::ListTokensResponse>, Status> {
        let caller = principal(&request)?;
        let wanted = request.into_inner();
        let filter = identity::TokenFilter {
            unused: wanted.unused,
            unexpired: wanted.unexpired,
        };
        let tokens = identity::list_tokens(&self.context.domain, &caller, filter).await?;
        Ok(Response::new(proto::ListTokensResponse {
            tokens: tokens
                .into_iter()
                .map(|view| token_message(view, String::new()))
                .collect(),
        }))
    }

    async fn revoke_token(
        &self,
        request: Request<proto::RevokeTokenRequest>,
    ) -> Result<Response<proto::JoinToken>, Status> {
        let caller = principal(&request)?;
        let id = request.into_inner().id;
        let view = identity::revoke_token(&self.context.domain, &caller, &id).await?;
        Ok(Response::new(token_message(view, String::new())))
    }

    async fn cleanup_tokens(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::CleanupTokensResponse>, Status> {
        let caller = principal(&request)?;
        let removed = identity::cleanup_tokens(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::CleanupTokensResponse { removed }))
    }

    async fn issue_jwt(
        &self,
        request: Request<proto::IssueJwtRequest>,
    ) -> Result<Response<proto::JwtSvid>, Status> {
        let caller = principal(&request)?;
        let wanted = request.into_inner();
        let issue = jwt::IssueRequest {
            audience: wanted.audience,
            ttl: duration(wanted.ttl)?,
            subject: optional(wanted.subject),
        };
        let issued = jwt::issue_jwt(&self.context.domain, &caller, issue).await?;
        Ok(Response::new(jwt_message(issued.svid, issued.token)))
    }

    async fn list_jwts(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::ListJwtsResponse>, Status> {
        let caller = principal(&request)?;
        let jwts = jwt::list_jwts(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::ListJwtsResponse {
            jwts: jwts
                .into_iter()
                .map(|view| jwt_message(view, String::new()))
                .collect(),
        }))
    }

    async fn revoke_jwt(
        &self,
        request: Request<proto::RevokeJwtRequest>,
    ) -> Result<Response<proto::JwtSvid>, Status> {
        let caller = principal(&request)?;
        let id = request.into_inner().id;
        let view = jwt::revoke_jwt(&self.context.domain, &caller, &id).await?;
        Ok(Response::new(jwt_message(view, String::new())))
    }

    async fn verify_jwt(
        &self,
        request: Request<proto::VerifyJwtRequest>,
    ) -> Result<Response<proto::VerifyJwtResponse>, Status> {
        let caller = principal(&request)?;
        let wanted = request.into_inner();
        let verification = jwt::verify_jwt(
            &self.context.domain,
            &caller,
            &wanted.token,
            &wanted.audience,
        )
        .await?;
        let claims = verification.claims.unwrap_or_else(|| jwt::Claims {
            sub: String::new(),
            aud: Vec::new(),
            exp: 0,
            iat: None,
            jti: String::new(),
        });
        Ok(Response::new(proto::VerifyJwtResponse {
            valid: verification.valid,
            reason: verification.reason.unwrap_or_default(),
            subject: claims.sub,
            audience: claims.aud,
            exp: claims.exp,
            iat: claims.iat.unwrap_or_default(),
            jti: claims.jti,
        }))
    }
}
