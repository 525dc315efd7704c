"""Users, policies and client quotas in the metadata (rocket/access.py has the model): the calls that create, list
and delete them, the state nodes fetch to enforce them, and the first user of a cluster with auth on; the calls take
and return typed messages (rocket/serde/typed.py). A part of Nameserver, over the metadata group.
"""

from __future__ import annotations

import logging
import sys

import trio

from rocket import access, limits, quotas
from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.roles.nameserver.group import MetadataGroup
from rocket.serde.typed import (AclCreateUserRequest, AclPoliciesResponse, AclPolicy, AclQuota, AclQuotasRequest,
                                AclQuotasResponse, AclSealedUser, AclState, AclStateRequest, AclUser, AclUserRequest,
                                AclUsersResponse, Empty, convert, plain)

log = logging.getLogger("rocket.nameserver")


class AclAdmin:
    """The user, policy and quota calls. A user's secret is sealed under the cluster key before it is proposed, so
    the Raft log, its snapshots and every node's disk hold it only sealed; nodes unseal it with the same key (all
    hold the cluster secret)."""

    def __init__(self, meta: MetadataGroup, config: NodeConfig, clock: Clock):
        self.meta = meta
        self.config = config
        self.clock = clock
        self._acl_key = access.cluster_key(self.config.cluster_secret) if self.config.cluster_secret else None

    def _sealing_key(self) -> bytes:
        if self._acl_key is None:
            raise RocketError(Code.BAD_REQUEST, "users need a cluster_secret on the nameservers: their secrets are "
                              "sealed under it")
        return self._acl_key

    async def acl_create_user(self, request: AclCreateUserRequest) -> AclUser:
        access.check_user_name(request.user)
        if request.secret and len(request.secret) < limits.cluster_secret_chars_min:
            raise RocketError(Code.BAD_REQUEST, f"a secret has at least {limits.cluster_secret_chars_min} characters")
        self._sealing_key()
        return await self.meta.on_leader("AclCreateUser", request, self._create_user_here)

    async def _create_user_here(self, request: AclCreateUserRequest) -> AclUser:
        name, secret = request.user, request.secret or access.new_secret()
        created_ms = self.clock.wall_ms()
        await self.meta.propose({"op": "create_user", "user": name, "super": request.super, "created_ms": created_ms,
                                 "sealed": access.seal(self._sealing_key(), name, secret)})
        log.info("user %s created%s", name, " (super user)" if request.super else "")
        return AclUser(name, secret, request.super, created_ms)

    async def acl_delete_user(self, request: AclUserRequest) -> Empty:
        return await self.meta.on_leader("AclDeleteUser", request, self._delete_user_here)

    async def _delete_user_here(self, request: AclUserRequest) -> Empty:
        self.meta.metadata.user(request.user)
        await self.meta.propose({"op": "delete_user", "user": request.user})
        log.info("user %s deleted, with its policies", request.user)
        return Empty()

    async def acl_users(self, request: Empty) -> AclUsersResponse:
        return await self.meta.read("AclUsers", request, self._users_here)

    async def _users_here(self, request: Empty) -> AclUsersResponse:
        users = self.meta.metadata.users
        return AclUsersResponse([AclUser(name, "", users[name]["super"], users[name]["created_ms"])
                                 for name in sorted(users)])

    async def acl_grant(self, request: AclPolicy) -> AclPolicy:
        if request.effect not in access.EFFECTS:
            raise RocketError(Code.BAD_REQUEST, f"effect {request.effect!r}: allow or deny")
        policy = AclPolicy(access.check_user_name(request.user), access.check_resource(request.resource),
                           list(access.check_actions(request.actions)), request.effect,
                           list(access.check_cidrs(request.cidrs)))
        return await self.meta.on_leader("AclGrant", policy, self._grant_here)

    async def _grant_here(self, policy: AclPolicy) -> AclPolicy:
        self.meta.metadata.user(policy.user)
        await self.meta.propose({"op": "grant", "policy": plain(policy)})
        log.info("policy: %s", policy)
        return policy

    async def acl_revoke(self, request: AclPolicy) -> Empty:
        """The user's policies on the resource (the one of the effect given, if one is)."""
        if request.effect not in ("", *access.EFFECTS):
            raise RocketError(Code.BAD_REQUEST, f"effect {request.effect!r}: allow, deny, or empty for both")
        return await self.meta.on_leader("AclRevoke", request, self._revoke_here)

    async def _revoke_here(self, request: AclPolicy) -> Empty:
        await self.meta.propose({"op": "revoke", "user": request.user, "resource": access.in_namespace(
            request.resource, "resource"),
                                 "effect": request.effect})
        log.info("revoked: %s's policies on %s", request.user, request.resource)
        return Empty()

    async def acl_policies(self, request: AclUserRequest) -> AclPoliciesResponse:
        return await self.meta.read("AclPolicies", request, self._policies_here)

    async def _policies_here(self, request: AclUserRequest) -> AclPoliciesResponse:
        policies = sorted(self.meta.metadata.policies.items())
        return AclPoliciesResponse([convert(policy, AclPolicy) for key, policy in policies
                                    if request.user in ("", key[0])])

    async def acl_set_quota(self, request: AclQuota) -> AclQuota:
        """Set an entity's quota, or drop it (delete)."""
        if request.delete:
            return await self.meta.on_leader("AclSetQuota", AclQuota(quotas.check_entity(request.entity),
                                                                     delete=True), self._delete_quota_here)
        return await self.meta.on_leader("AclSetQuota", convert(quotas.check_quota(plain(request)), AclQuota),
                                         self._set_quota_here)

    async def _set_quota_here(self, quota: AclQuota) -> AclQuota:
        stored = {key: getattr(quota, key) for key in ("entity", *quotas.RATES)}
        await self.meta.propose({"op": "set_quota", "quota": stored})
        log.info("quota: %s", stored)
        return quota

    async def _delete_quota_here(self, request: AclQuota) -> AclQuota:
        await self.meta.propose({"op": "delete_quota", "entity": request.entity})
        log.info("quota on %s dropped", request.entity)
        return AclQuota(request.entity, delete=True)

    async def acl_quotas(self, request: AclQuotasRequest) -> AclQuotasResponse:
        return await self.meta.read("AclQuotas", request, self._quotas_here)

    async def _quotas_here(self, request: AclQuotasRequest) -> AclQuotasResponse:
        found = self.meta.metadata.quotas
        return AclQuotasResponse([convert(found[entity], AclQuota) for entity in sorted(found)
                                  if request.entity in ("", entity)])

    async def acl_state(self, request: AclStateRequest) -> AclState:
        """For nodes to enforce: nothing when the version asked is current. Read on the leader: a node asks when a
        heartbeat answer says the metadata changed, and a follower may not have applied that change yet (its answer
        would leave the node on old policies until the next change or limits.acl_recheck_s)."""
        return await self.meta.read("MetaAclState", request, self._acl_state_here, locally=False)

    async def _acl_state_here(self, request: AclStateRequest) -> AclState:
        metadata = self.meta.metadata
        if request.version == metadata.acl_version:
            return AclState(metadata.acl_version, False, [], [], [])
        return AclState(metadata.acl_version, True,
                        [convert({"user": name, **user}, AclSealedUser) for name, user in metadata.users.items()],
                        [convert(policy, AclPolicy) for policy in metadata.policies.values()],
                        [convert(quota, AclQuota) for quota in metadata.quotas.values()])

    async def bootstrap_admin_forever(self) -> None:
        """With auth on, the leader makes the first user, `admin` (super), once: with the configured secret, or a
        new one printed once to stderr."""
        while not self.meta.metadata.users:
            if self.meta.leads():
                configured = self.config.auth_admin_secret
                try:
                    made = await self._create_user_here(AclCreateUserRequest("admin", configured, True))
                except RocketError as error:
                    log.warning("auth: making the first user: %s", error)
                else:
                    if not configured:
                        line = (f"rocket: auth is on; the first user is admin, secret {made.secret} (shown once: "
                                "keep it, e.g. in ~/.config/rocket/credentials)")
                        print(line, file=sys.stderr, flush=True)  # not logged: logs are kept and shipped
                    return
            await trio.sleep(limits.acl_refresh_s)
