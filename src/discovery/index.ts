/**
 * Pool membership: the resolver interface that consumers (the encode hop's
 * router) watch, and the static resolver that reads members from config.
 */
export type { Member, Membership, Resolver } from "./resolver.js";
export { StaticResolver, staticDiscoverySchema } from "./static.js";
export type { StaticMemberInput } from "./static.js";
