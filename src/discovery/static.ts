import { z } from "zod";
import { hostPort } from "../server/index.js";
import { MembershipCell, type Member, type Membership, type Resolver } from "./resolver.js";

/** `HOST:PORT` by the host's own rule (checked when parsing, so this module loads before the server's). */
const address = z.string().superRefine((value, ctx) => {
  const parsed = hostPort.safeParse(value);
  if (!parsed.success) ctx.addIssue({ code: "custom", message: parsed.error.issues[0]?.message ?? "expected HOST:PORT" });
});

/**
 * Members listed in config: `[{ id?, address, metadata? }]`. An id
 * defaults to the address; two entries with the same id or the same
 * address are an error naming the index of the second.
 */
export const staticDiscoverySchema = z
  .array(
    z.strictObject({
      id: z.string().min(1).optional(),
      address,
      metadata: z.record(z.string(), z.string()).default({}),
    }),
  )
  .default([])
  .transform((entries, ctx): Member[] => {
    const ids = new Map<string, number>();
    const addresses = new Map<string, number>();
    const members: Member[] = [];
    entries.forEach((entry, index) => {
      const id = entry.id ?? entry.address;
      const sameAddress = addresses.get(entry.address);
      if (sameAddress !== undefined) {
        ctx.addIssue({ code: "custom", path: [index, "address"], message: `duplicate address "${entry.address}" (also at index ${sameAddress})` });
      }
      const sameId = ids.get(id);
      // An id defaulted from a duplicate address is the same mistake, reported once.
      if (sameId !== undefined && (entry.id !== undefined || sameAddress === undefined)) {
        ctx.addIssue({ code: "custom", path: [index, "id"], message: `duplicate id "${id}" (also at index ${sameId})` });
      }
      ids.set(id, ids.get(id) ?? index);
      addresses.set(entry.address, addresses.get(entry.address) ?? index);
      members.push({ id, address: entry.address, metadata: entry.metadata });
    });
    return members;
  });

/** What a config file may list. */
export type StaticMemberInput = NonNullable<z.input<typeof staticDiscoverySchema>>[number];

/**
 * Membership from config, fixed unless `update` (tests, an admin call)
 * commits another list. The first view is generation 1.
 */
export class StaticResolver implements Resolver {
  private readonly cell: MembershipCell;

  /** `members` as staticDiscoverySchema accepts them; throws the ZodError otherwise. */
  constructor(members: readonly StaticMemberInput[] = []) {
    this.cell = new MembershipCell(staticDiscoverySchema.parse(members));
  }

  current(): Membership {
    return this.cell.current();
  }

  watch(signal: AbortSignal): AsyncIterable<Membership> {
    return this.cell.watch(signal);
  }

  /**
   * Replaces the members (validated as in config). A new generation is
   * committed, and watchers told, only when the set of members, their
   * addresses or their metadata changed. Returns the view now current.
   */
  update(members: readonly StaticMemberInput[]): Membership {
    return this.cell.commit(staticDiscoverySchema.parse(members));
  }

  async close(): Promise<void> {
    this.cell.close();
  }
}
