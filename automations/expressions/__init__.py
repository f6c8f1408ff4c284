"""Pure expression modules, no Django: the template sandbox and the event filter grammar."""
