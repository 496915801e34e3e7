//! SecretsService: KV, transit and leases (contract §11). Thin: unpack, call `secrets::` with
//! the caller's principal, pack. The role is checked in the auth layer first and again in
//! the domain; audit rows are the domain's (the auth layer's for a refusal by role).

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::principal;
use crate::proto;
use crate::secrets::{kv, leases, transit};
use crate::server::Context;

pub struct Secrets {
    pub context: Arc<Context>,
}

impl From<kv::Metadata> for proto::SecretMetadata {
    fn from(meta: kv::Metadata) -> Self {
        proto::SecretMetadata {
            path: meta.path,
            version: meta.version as u32,
            created_at: meta.created_at,
            updated_at: meta.updated_at,
            deleted: meta.deleted_at.is_some(),
            deleted_at: meta.deleted_at.unwrap_or_default(),
        }
    }
}

impl From<transit::KeyInfo> for proto::TransitKey {
    fn from(key: transit::KeyInfo) -> Self {
        proto::TransitKey {
            name: key.name,
            r#type: key.key_type,
            latest_version: key.latest_version as u32,
            min_decryption_version: key.min_decryption_version as u32,
            created_at: key.created_at,
        }
    }
}

impl From<leases::Lease> for proto::Lease {
    fn from(lease: leases::Lease) -> Self {
        proto::Lease {
            id: lease.id,
            path: lease.path,
            created_at: lease.created_at,
            expires_at: lease.expires_at,
            renewable: lease.renewable,
            data_json: lease.data.to_string(),
            backend: lease.backend,
            max_expires_at: lease.max_expires_at,
            last_error: lease.last_error.unwrap_or_default(),
        }
    }
}

fn sealed(sealed: transit::Sealed) -> proto::TransitResponse {
    proto::TransitResponse {
        ciphertext: sealed.ciphertext,
        key_version: sealed.key_version as u32,
        ..Default::default()
    }
}

/// An optional duration field: empty is None.
fn duration(text: &str, field: &str) -> crate::Result<Option<Duration>> {
    if text.is_empty() {
        return Ok(None);
    }
    crate::clock::parse_duration(text)
        .map(Some)
        .ok_or_else(|| crate::Error::Invalid(format!("{field} '{text}' is not a duration like 1h")))
}

#[tonic::async_trait]
impl proto::secrets_service_server::SecretsService for Secrets {
    async fn put(
        &self,
        request: Request<proto::PutSecretRequest>,
    ) -> Result<Response<proto::SecretMetadata>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let data = message.data.into_iter().collect();
        let meta = kv::put(&self.context.domain, &caller, &message.path, data).await?;
        Ok(Response::new(meta.into()))
    }

    async fn get(
        &self,
        request: Request<proto::GetSecretRequest>,
    ) -> Result<Response<proto::Secret>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let version = (message.version > 0).then_some(i64::from(message.version));
        let value = kv::get(&self.context.domain, &caller, &message.path, version).await?;
        Ok(Response::new(proto::Secret {
            path: value.path,
            version: value.version as u32,
            data: value.data.into_iter().collect(),
            created_at: value.created_at,
        }))
    }

    async fn delete(
        &self,
        request: Request<proto::DeleteSecretRequest>,
    ) -> Result<Response<proto::DeleteSecretResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let deletion = kv::Deletion {
            versions: message.versions.into_iter().map(i64::from).collect(),
            destroy: message.destroy,
        };
        let changed = kv::delete(&self.context.domain, &caller, &message.path, &deletion).await?;
        Ok(Response::new(proto::DeleteSecretResponse { changed }))
    }

    async fn list(
        &self,
        request: Request<proto::ListSecretsRequest>,
    ) -> Result<Response<proto::ListSecretsResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let secrets = kv::list(
            &self.context.domain,
            &caller,
            &request.prefix,
            request.include_deleted,
        )
        .await?;
        Ok(Response::new(proto::ListSecretsResponse {
            secrets: secrets.into_iter().map(Into::into).collect(),
        }))
    }

    async fn rotate_master(
        &self,
        request: Request<proto::RotateMasterRequest>,
    ) -> Result<Response<proto::RotateMasterResponse>, Status> {
        let caller = principal(&request)?;
        let new_key = request.into_inner().new_master_key;
        let rewrapped =
            crate::secrets::rotate_master(&self.context.domain, &caller, &new_key).await?;
        Ok(Response::new(proto::RotateMasterResponse { rewrapped }))
    }

    async fn transit_create_key(
        &self,
        request: Request<proto::TransitKeyRequest>,
    ) -> Result<Response<proto::TransitKey>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let key_type = if message.r#type.is_empty() {
            transit::AES256_GCM
        } else {
            message.r#type.as_str()
        };
        let key =
            transit::create_key(&self.context.domain, &caller, &message.name, key_type).await?;
        Ok(Response::new(key.into()))
    }

    async fn transit_list_keys(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::TransitListKeysResponse>, Status> {
        let caller = principal(&request)?;
        let keys = transit::list_keys(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::TransitListKeysResponse {
            keys: keys.into_iter().map(Into::into).collect(),
        }))
    }

    async fn transit_encrypt(
        &self,
        request: Request<proto::TransitRequest>,
    ) -> Result<Response<proto::TransitResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let result = transit::encrypt(
            &self.context.domain,
            &caller,
            &message.name,
            &message.plaintext,
        )
        .await?;
        Ok(Response::new(sealed(result)))
    }

    async fn transit_decrypt(
        &self,
        request: Request<proto::TransitRequest>,
    ) -> Result<Response<proto::TransitResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let plaintext = transit::decrypt(
            &self.context.domain,
            &caller,
            &message.name,
            &message.ciphertext,
        )
        .await?;
        Ok(Response::new(proto::TransitResponse {
            plaintext,
            ..Default::default()
        }))
    }

    async fn transit_sign(
        &self,
        request: Request<proto::TransitRequest>,
    ) -> Result<Response<proto::TransitResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let signed =
            transit::sign(&self.context.domain, &caller, &message.name, &message.data).await?;
        Ok(Response::new(proto::TransitResponse {
            signature: signed.ciphertext,
            key_version: signed.key_version as u32,
            ..Default::default()
        }))
    }

    async fn transit_verify(
        &self,
        request: Request<proto::TransitRequest>,
    ) -> Result<Response<proto::TransitResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let valid = transit::verify(
            &self.context.domain,
            &caller,
            &message.name,
            &message.data,
            &message.signature,
        )
        .await?;
        Ok(Response::new(proto::TransitResponse {
            valid,
            ..Default::default()
        }))
    }

    async fn transit_rotate(
        &self,
        request: Request<proto::TransitKeyRequest>,
    ) -> Result<Response<proto::TransitKey>, Status> {
        let caller = principal(&request)?;
        let name = request.into_inner().name;
        let key = transit::rotate(&self.context.domain, &caller, &name).await?;
        Ok(Response::new(key.into()))
    }

    async fn transit_config_key(
        &self,
        request: Request<proto::TransitKeyRequest>,
    ) -> Result<Response<proto::TransitKey>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let key = transit::set_min_decryption_version(
            &self.context.domain,
            &caller,
            &message.name,
            i64::from(message.min_decryption_version),
        )
        .await?;
        Ok(Response::new(key.into()))
    }

    async fn transit_rewrap(
        &self,
        request: Request<proto::TransitRequest>,
    ) -> Result<Response<proto::TransitResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let result = transit::rewrap(
            &self.context.domain,
            &caller,
            &message.name,
            &message.ciphertext,
        )
        .await?;
        Ok(Response::new(sealed(result)))
    }

    async fn create_credentials(
        &self,
        request: Request<proto::CredentialsRequest>,
    ) -> Result<Response<proto::Credentials>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let ttl = duration(&message.ttl, "ttl")?;
        let credentials =
            leases::create_credentials(&self.context.domain, &caller, &message.backend, ttl)
                .await?;
        Ok(Response::new(proto::Credentials {
            lease: Some(credentials.lease.into()),
            username: credentials.username,
            password: credentials.password,
        }))
    }

    async fn list_leases(
        &self,
        request: Request<proto::ListLeasesRequest>,
    ) -> Result<Response<proto::ListLeasesResponse>, Status> {
        let caller = principal(&request)?;
        let prefix = request.into_inner().prefix;
        let leases = leases::list(&self.context.domain, &caller, &prefix).await?;
        Ok(Response::new(proto::ListLeasesResponse {
            leases: leases.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_lease(
        &self,
        request: Request<proto::LeaseRequest>,
    ) -> Result<Response<proto::Lease>, Status> {
        let caller = principal(&request)?;
        let id = request.into_inner().id;
        let lease = leases::show(&self.context.domain, &caller, &id).await?;
        Ok(Response::new(lease.into()))
    }

    async fn renew_lease(
        &self,
        request: Request<proto::LeaseRequest>,
    ) -> Result<Response<proto::Lease>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let increment = duration(&message.increment, "increment")?;
        let lease = leases::renew(&self.context.domain, &caller, &message.id, increment).await?;
        Ok(Response::new(lease.into()))
    }

    async fn revoke_lease(
        &self,
        request: Request<proto::LeaseRequest>,
    ) -> Result<Response<proto::RevokeLeaseResponse>, Status> {
        let caller = principal(&request)?;
        let message = request.into_inner();
        let revoked = if message.id.is_empty() {
            leases::revoke_prefix(&self.context.domain, &caller, &message.prefix).await?
        } else {
            leases::revoke(&self.context.domain, &caller, &message.id).await?
        };
        Ok(Response::new(proto::RevokeLeaseResponse { revoked }))
    }
}
