/** The scopes that name something, from the services of proto/ (the descriptor image) and those a process serves. */
import type { DescService } from "@bufbuild/protobuf";
import { loadDescriptorImage, type DescriptorImage } from "../reflection-image.js";
import { ScopeCatalog, type ServiceNames } from "./scopes.js";

/** The services of a descriptor image, as scopes see them. */
function imageServices(image: DescriptorImage): ServiceNames[] {
  return [...image.values()].flatMap((file) =>
    file.service.map((s) => ({ typeName: file.package === "" ? s.name : `${file.package}.${s.name}`, methods: s.method.map((m) => m.name) })),
  );
}

/**
 * Every scope of proto/'s services and of `served`. Without the image
 * (`npm run generate` not run) it knows only `served` and the levels.
 */
export async function scopeCatalog(served: readonly DescService[] = []): Promise<ScopeCatalog> {
  const image = await loadDescriptorImage();
  return new ScopeCatalog([...imageServices(image), ...served.map((s) => ({ typeName: s.typeName, methods: s.methods.map((m) => m.name) }))]);
}
