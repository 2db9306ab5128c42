/**
 * Pool membership: the resolver interface that consumers (the encode hop's
 * router) watch, the static resolver that reads members from config, and
 * the etcd resolver and registration.
 */
export type { Member, Membership, Resolver } from "./resolver.js";
export { StaticResolver, staticDiscoverySchema } from "./static.js";
export type { StaticMemberInput } from "./static.js";
export { EtcdRegistration, EtcdResolver, etcdDiscoverySchema, etcdPoolPrefix } from "./etcd.js";
export type { EtcdDiscoveryConfig, EtcdDiscoveryInput, EtcdPool, EtcdRegistrationOptions, EtcdResolverOptions } from "./etcd.js";
