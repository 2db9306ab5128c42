import { Command } from "commander";
export function imagesCommand(): Command { return new Command("images"); }
