/**
 * Access control: named callers (bearer keys of auth.token and
 * auth.keysFile, client certificates of auth.certificates) with scopes, the
 * verdict on each call, the keys file's reloads, and what `mmgate keys`
 * needs to edit the file.
 */
export { AccessControl, authEnabled, KEYS_FILE_WATCH, type AccessControlOptions, type AuthConfig, type Verdict } from "./access-control.js";
export { scopeCatalog } from "./catalog.js";
export { configuredKeysFile } from "./configured.js";
export { certificateTest, describeCertificate, parseAltNames, type AltName } from "./certificates.js";
export { KeysFileError, type KeysFileErrorCode } from "./errors.js";
export { compileCertificateRules, KeySet, type CallerEntry } from "./key-set.js";
export { generateKey, isJsonFile, KEY_PREFIX, keyDigest, parseKeysDocument, parseKeysText, readKeysFileSync, validateKeys } from "./keys-file.js";
export { addKey, removeKey, writeFileAtomic } from "./keys-edit.js";
export {
  CALLER_NAME,
  callerLimitsSchema,
  callerNameSchema,
  certificateRuleSchema,
  certificateRulesSchema,
  keyEntrySchema,
  keysFileSchema,
  RESERVED_CALLER_NAMES,
  scopeSchema,
  TOKEN_CALLER_NAME,
  type CertificateRule,
  type KeyEntry,
} from "./schema.js";
export {
  Access,
  ACCESS_SCOPES,
  accessScope,
  grantingScopes,
  kebabServiceName,
  methodAccess,
  methodScope,
  ScopeCatalog,
  SERVICE_SCOPES,
  serviceScope,
  type AccessScope,
  type ServiceNames,
} from "./scopes.js";
