/**
 * The parts of Kubernetes objects the deploy tests read, as the manifests
 * under deploy/kubernetes/ write them: typed views over parsed YAML, one
 * definition for every test that checks a manifest against the code.
 */
type Obj = Record<string, unknown>;

export interface Probe {
  httpGet?: { path: string; port: string | number; scheme?: "HTTP" | "HTTPS" };
  grpc?: { port: number; service?: string };
  tcpSocket?: { port: string | number };
}
export interface ContainerPort {
  name?: string;
  containerPort: number;
}
export interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { fieldRef?: { fieldPath: string }; secretKeyRef?: { name: string; key: string; optional?: boolean } };
}
export interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  ports?: ContainerPort[];
  env?: EnvVar[];
  readinessProbe?: Probe;
  livenessProbe?: Probe;
  startupProbe?: Probe;
  resources?: { requests?: Obj; limits?: Obj };
  securityContext?: { readOnlyRootFilesystem?: boolean; runAsNonRoot?: boolean; allowPrivilegeEscalation?: boolean; capabilities?: { drop?: string[] } };
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean; subPath?: string }[];
  lifecycle?: { preStop?: { exec?: { command: string[] }; sleep?: { seconds: number } } };
}
/** A pod's volume: the kinds the manifests use. */
export interface Volume {
  name: string;
  configMap?: { name: string };
  secret?: { secretName: string; defaultMode?: number; optional?: boolean; items?: { key: string; path: string }[] };
  emptyDir?: Obj;
}
/** A Deployment or a StatefulSet. */
export interface Workload {
  kind?: "Deployment" | "StatefulSet";
  metadata: { name: string; labels?: Record<string, string> };
  spec: {
    replicas?: number;
    serviceName?: string;
    selector: { matchLabels: Record<string, string> };
    template: {
      metadata: { labels: Record<string, string> };
      spec: {
        terminationGracePeriodSeconds?: number;
        automountServiceAccountToken?: boolean;
        securityContext?: { runAsNonRoot?: boolean; runAsUser?: number; runAsGroup?: number; fsGroup?: number };
        containers: Container[];
        volumes?: Volume[];
      };
    };
  };
}
export interface Service {
  metadata: { name: string };
  spec: { clusterIP?: string; selector: Record<string, string>; ports: { name: string; port: number; targetPort: string | number; appProtocol?: string }[] };
}
export interface ConfigMap {
  metadata: { name: string };
  data: Record<string, string>;
}
export interface Pdb {
  metadata: { name: string };
  spec: { maxUnavailable?: number | string; minAvailable?: number | string; selector: { matchLabels: Record<string, string> } };
}
export interface Kustomization {
  resources: string[];
  configMapGenerator?: { name: string; files?: string[] }[];
  namePrefix?: string;
  nameSuffix?: string;
}
export interface Secret {
  metadata: { name: string };
  type?: string;
  data?: Record<string, string>;
  stringData?: Record<string, string>;
}
/** cert-manager's Certificate (cert-manager.io/v1): the Secret it writes (tls.crt, tls.key, ca.crt) and what the certificate says. */
export interface Certificate {
  metadata: { name: string };
  spec: {
    secretName: string;
    commonName?: string;
    dnsNames?: string[];
    uris?: string[];
    ipAddresses?: string[];
    usages?: string[];
    isCA?: boolean;
    issuerRef: { name: string; kind?: string; group?: string };
  };
}
